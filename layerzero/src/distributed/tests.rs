use std::sync::{Arc, Barrier, Mutex};

use super::*;
use crate::TestResult;

/// A group of threads in one process: each rank posts its contribution, waits for the others,
/// reads everyone's.
struct Threads {
    rank: usize,
    size: usize,
    barrier: Arc<Barrier>,
    board: Arc<Mutex<Vec<Vec<u8>>>>,
}

impl Threads {
    fn group(size: usize) -> Vec<Threads> {
        let barrier = Arc::new(Barrier::new(size));
        let board = Arc::new(Mutex::new(vec![Vec::new(); size]));
        (0..size).map(|rank| Threads { rank, size, barrier: barrier.clone(), board: board.clone() }).collect()
    }

    fn exchange(&self, bytes: &[u8]) -> Result<Vec<Vec<u8>>> {
        let poisoned = || Error::invalid("the board lock was poisoned");
        self.board.lock().map_err(|_| poisoned())?[self.rank] = bytes.to_vec();
        self.barrier.wait();
        let all = self.board.lock().map_err(|_| poisoned())?.clone();
        self.barrier.wait();
        Ok(all)
    }
}

impl Collective for Threads {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn all_reduce_min_max(&self, words: &[i64]) -> Result<(Vec<i64>, Vec<i64>)> {
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        let all = self.exchange(&bytes)?;
        let decode = |b: &Vec<u8>| -> Vec<i64> {
            b.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap_or([0; 8]))).collect()
        };
        let mut min = decode(&all[0]);
        let mut max = min.clone();
        for b in &all[1..] {
            for (i, w) in decode(b).into_iter().enumerate() {
                min[i] = min[i].min(w);
                max[i] = max[i].max(w);
            }
        }
        Ok((min, max))
    }

    fn all_gather(&self, bytes: &[u8]) -> Result<Vec<Vec<u8>>> {
        self.exchange(bytes)
    }

    fn broadcast(&self, bytes: &[u8], root: usize) -> Result<Vec<u8>> {
        Ok(self.exchange(bytes)?.swap_remove(root))
    }
}

fn facts(policy: &str, bucket_kernel: &str) -> Facts {
    let mut items = BTreeMap::new();
    items.insert("catalog".to_owned(), "c0ffee".to_owned());
    items.insert("policy".to_owned(), policy.to_owned());
    items.insert("bucket:attention seq_k=1..16".to_owned(), bucket_kernel.to_owned());
    Facts { items }
}

fn run(each: Vec<Facts>) -> Vec<Result<()>> {
    let group = Threads::group(each.len());
    std::thread::scope(|s| {
        let handles: Vec<_> = group.iter().zip(&each).map(|(g, f)| s.spawn(move || agree(f, g))).collect();
        handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(Error::invalid("a rank panicked")))).collect()
    })
}

#[test]
fn ranks_holding_the_same_facts_agree() -> TestResult {
    for r in run(vec![facts("p", "cpu.attention.flash"); 4]) {
        r?;
    }
    Ok(())
}

#[test]
fn one_rank_with_another_policy_fails_every_rank_naming_it_and_the_bucket() -> TestResult {
    let mut each = vec![facts("p", "cpu.attention.flash"); 4];
    each[2] = facts("q", "cpu_reference.attention.naive");
    for r in run(each) {
        let e = r.err().ok_or("every rank must fail")?;
        assert_eq!(e.kind(), ErrorKind::PlanMismatch);
        let m = e.to_string();
        assert!(m.contains("policy: ranks 0,1,3 have p; rank 2 has q"), "{m}");
        assert!(m.contains("bucket:attention seq_k=1..16"), "{m}");
        assert!(m.contains("rank 2 has cpu_reference.attention.naive"), "{m}");
        assert!(!m.contains("catalog"), "facts that agree are not listed: {m}");
    }
    Ok(())
}

#[test]
fn a_handle_lists_what_decides_its_choices() -> TestResult {
    let lz = LayerZero::planning("spr")?;
    let f = lz.agreement_facts(None)?;
    for name in ["catalog", "policy", "hardware", "table"] {
        assert!(f.items.contains_key(name), "{name} missing from {:?}", f.items);
    }
    assert_eq!(f.words().len(), 4);
    assert_eq!(f.words(), lz.agreement_facts(None)?.words(), "the same handle hashes the same");
    Ok(())
}
