//! MPI as LayerZero's collectives, for Rust hosts launched by `mpirun` (feature `mpi`, off by
//! default: the `mpi` crate links libmpi, so only a build that asks for it needs MPI). The
//! engine initializes MPI and owns its communicators; a group borrows one.

use mpi::collective::SystemOperation;
use mpi::datatype::PartitionMut;
use mpi::traits::{Communicator, CommunicatorCollectives, Root};

use super::Collective;
use crate::error::{Error, Result};

/// An MPI communicator as a [`Collective`] (`MpiGroup::new(universe.world())`).
pub struct MpiGroup<C: Communicator> {
    comm: C,
}

impl<C: Communicator> MpiGroup<C> {
    /// The group of `comm`'s processes.
    pub fn new(comm: C) -> MpiGroup<C> {
        MpiGroup { comm }
    }

    /// The communicator.
    pub fn communicator(&self) -> &C {
        &self.comm
    }
}

/// MPI counts are `int`: a contribution past 2 GiB is refused, not truncated.
fn count(len: usize) -> Result<mpi::Count> {
    mpi::Count::try_from(len)
        .map_err(|_| Error::invalid(format!("a collective of {len} bytes exceeds MPI's count limit (2^31 - 1)")))
}

impl<C: Communicator> Collective for MpiGroup<C> {
    fn rank(&self) -> usize {
        usize::try_from(self.comm.rank()).unwrap_or(0)
    }

    fn size(&self) -> usize {
        usize::try_from(self.comm.size()).unwrap_or(0)
    }

    fn all_reduce_min_max(&self, words: &[i64]) -> Result<(Vec<i64>, Vec<i64>)> {
        // One MIN all-reduce gives both: max(w) = !min(!w) (bitwise not reverses the order of
        // i64 without the overflow negation has at the minimum).
        let both: Vec<i64> = words.iter().copied().chain(words.iter().map(|w| !w)).collect();
        let mut out = vec![0i64; both.len()];
        self.comm.all_reduce_into(&both[..], &mut out[..], SystemOperation::min());
        let max = out.split_off(words.len()).into_iter().map(|w| !w).collect();
        Ok((out, max))
    }

    fn all_gather(&self, bytes: &[u8]) -> Result<Vec<Vec<u8>>> {
        let mine = count(bytes.len())?;
        let mut counts = vec![0 as mpi::Count; self.size()];
        self.comm.all_gather_into(&mine, &mut counts[..]);
        let mut displs = Vec::with_capacity(counts.len());
        let mut total: usize = 0;
        for &c in &counts {
            displs.push(count(total)?);
            total += usize::try_from(c).unwrap_or(0);
        }
        count(total)?;
        let mut buf = vec![0u8; total];
        {
            let mut parts = PartitionMut::new(&mut buf[..], &counts[..], &displs[..]);
            self.comm.all_gather_varcount_into(bytes, &mut parts);
        }
        let mut out = Vec::with_capacity(counts.len());
        let mut at = 0usize;
        for &c in &counts {
            let n = usize::try_from(c).unwrap_or(0);
            out.push(buf[at..at + n].to_vec());
            at += n;
        }
        Ok(out)
    }

    fn broadcast(&self, bytes: &[u8], root: usize) -> Result<Vec<u8>> {
        let root_rank =
            mpi::Rank::try_from(root).map_err(|_| Error::invalid(format!("root rank {root} is out of range")))?;
        let process = self.comm.process_at_rank(root_rank);
        let mut len: u64 = if self.rank() == root { bytes.len() as u64 } else { 0 };
        process.broadcast_into(&mut len);
        let len = usize::try_from(len).map_err(|_| Error::invalid(format!("a broadcast of {len} bytes")))?;
        count(len)?;
        let mut buf = if self.rank() == root { bytes.to_vec() } else { vec![0u8; len] };
        process.broadcast_into(&mut buf[..]);
        Ok(buf)
    }
}
