//! One plan from the root's timings: the root of a group solves (its PerfDB, its tuning), the
//! others receive the table and load it; nobody else measures. A failure on the root reaches
//! every rank as an error, never as a rank waiting for a broadcast that will not come.

use super::Collective;
use crate::error::{Error, ErrorKind, Result};
use crate::plan::solve::{Provenance, solve};
use crate::plan::table::DispatchTable;
use crate::plan::workload::Workload;
use crate::runtime::{LayerZero, PlanMode};

/// Runs `make` on the root only and hands its bytes to every rank; when it fails there, every
/// rank gets the root's error (its kind and message).
pub fn from_root(group: &dyn Collective, root: usize, make: impl FnOnce() -> Result<Vec<u8>>) -> Result<Vec<u8>> {
    let message = if group.rank() == root {
        match make() {
            Ok(bytes) => [b"T".as_slice(), &bytes].concat(),
            Err(e) => format!("E{}\n{}", e.kind().as_str(), e.message()).into_bytes(),
        }
    } else {
        Vec::new()
    };
    let got = group.broadcast(&message, root)?;
    match got.split_first() {
        Some((b'T', bytes)) => Ok(bytes.to_vec()),
        Some((b'E', text)) => {
            let text = String::from_utf8_lossy(text);
            let (kind, message) = text.split_once('\n').unwrap_or(("", &text));
            let kind = ErrorKind::from_name(kind).unwrap_or(ErrorKind::InvalidInput);
            Err(Error::new(kind, format!("rank {root} failed: {message}")))
        }
        _ => Err(Error::new(ErrorKind::Io, format!("rank {root}'s broadcast was empty or garbled"))),
    }
}

/// Solves `workload` on rank 0 of `group` with rank 0's handle (its measurements and policy),
/// broadcasts the table, and returns every rank's `lz` serving it in `mode`, after agreeing
/// with the others on every bucket of `workload` (a rank that would serve differently fails
/// every rank with `PlanMismatch`).
pub fn solve_on_root(lz: LayerZero, workload: &Workload, group: &dyn Collective, mode: PlanMode) -> Result<LayerZero> {
    let bytes = from_root(group, 0, || {
        let provenance = Provenance {
            perfdb_digest: lz.selector().measurements().map(crate::score::measured::Measurements::digest),
            created_at: crate::time::format_utc(crate::time::now_unix()),
            command: format!("layerzero::distributed::solve_on_root({}, {} ranks)", workload.name, group.size()),
        };
        Ok(solve(workload, &lz.selector(), provenance)?.to_json().into_bytes())
    })?;
    let text = String::from_utf8(bytes).map_err(|e| Error::invalid(format!("the root's table is not UTF-8: {e}")))?;
    let table = DispatchTable::parse(&text, "the root's table").map_err(|r| r.error)?;
    let lz = lz.with_plan(&table, mode)?;
    lz.agree(group, Some(workload))?;
    Ok(lz)
}
