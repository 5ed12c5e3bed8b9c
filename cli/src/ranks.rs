//! `lz readiness-check` under an MPI launcher (`mpirun -np 4 lz readiness-check ...`): every
//! rank builds the handle it would serve with and the ranks agree over MPI (`lz` built with
//! the `mpi` feature). Without the feature the ranks cannot talk, and the check says so.

use std::path::Path;
use std::sync::Arc;

use layerzero::capabilities::catalog::Catalog;
use layerzero::distributed::Facts;
use layerzero::error::Result;
use layerzero::plan::workload::Workload;
use layerzero::policy::Policy;
use layerzero::readiness::Check;
use layerzero::{LayerZero, PlanMode};

/// The world size an MPI launcher gave this process (OpenMPI, MPICH/Hydra, PMIx), if any.
pub(super) fn launched_size() -> Option<String> {
    ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"].iter().find_map(|v| std::env::var(v).ok())
}

/// What `lz readiness-check` was asked to serve with, as this rank sees it.
pub(super) struct Inputs<'a> {
    pub catalog: Result<Arc<Catalog>>,
    pub policy: Option<&'a Path>,
    pub table: Option<&'a Path>,
    pub workload: Option<&'a Path>,
    pub perfdb: Option<&'a Path>,
}

/// The facts of the handle the inputs describe: its catalog, policy (with the knobs'
/// overrides), PerfDB and table, and the workload's buckets.
fn facts(i: Inputs<'_>) -> Result<Facts> {
    let mut p = i.policy.map(Policy::load).transpose()?.unwrap_or_default();
    p.apply_overrides(&super::knobs().policy_overrides());
    let mut lz = LayerZero::detected_with(i.catalog?)?.with_policy(p)?;
    let db = i.perfdb.map_or_else(|| super::knobs().perfdb_path(), Path::to_path_buf);
    if db.exists() {
        lz = lz.with_perfdb(&db)?;
    }
    if let Some(t) = i.table {
        lz = lz.with_plan_file(t, PlanMode::Prefer)?;
    }
    let w = i.workload.map(Workload::load).transpose()?;
    lz.agreement_facts(w.as_ref())
}

/// The `distributed` check of this rank; collective: every rank of the launch runs it, even
/// one whose inputs do not load (the others then fail naming its error).
pub(super) fn check(size: &str, inputs: Inputs<'_>) -> Check {
    let workload = inputs.workload.map(|p| p.display().to_string());
    agree(size, facts(inputs), workload.as_deref())
}

#[cfg(feature = "mpi")]
fn agree(_size: &str, facts: Result<Facts>, workload: Option<&str>) -> Check {
    use layerzero::distributed::mpi::MpiGroup;
    let Some(universe) = mpi::initialize() else {
        return Check::fail("distributed", "MPI was initialized twice".into(), "report this as a bug".into());
    };
    layerzero::readiness::distributed_check_of(facts, &MpiGroup::new(universe.world()), workload)
}

#[cfg(not(feature = "mpi"))]
fn agree(size: &str, _facts: Result<Facts>, _workload: Option<&str>) -> Check {
    Check::fail(
        "distributed",
        format!(
            "launched by MPI as one of {size} ranks, but this lz was built without the `mpi` feature: the ranks cannot compare their plans"
        ),
        "build lz with `cargo build --release -p layerzero-cli --features mpi` (needs OpenMPI and libclang), or check ranks from Python (`layerzero.readiness_check(group=...)`)".into(),
    )
}
