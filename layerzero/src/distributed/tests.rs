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
    for name in ["catalog", "policy", "hardware", "table", "measurements", "parity", "calibration"] {
        assert!(f.items.contains_key(name), "{name} missing from {:?}", f.items);
    }
    assert_eq!(f.words().len(), 4);
    assert_eq!(f.words(), lz.agreement_facts(None)?.words(), "the same handle hashes the same");
    Ok(())
}

/// Runs `body` on every rank of a group of threads, results by rank.
fn each_rank<T: Send>(size: usize, body: impl Fn(&Threads) -> Result<T> + Sync) -> Vec<Result<T>> {
    let group = Threads::group(size);
    std::thread::scope(|s| {
        let body = &body;
        let handles: Vec<_> = group.iter().map(|g| s.spawn(move || body(g))).collect();
        handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(Error::invalid("a rank panicked")))).collect()
    })
}

fn on_machine(hardware: &str, policy: &str) -> Facts {
    let mut f = facts(policy, "cpu.attention.flash");
    f.items.insert("hardware".to_owned(), hardware.to_owned());
    f
}

#[test]
fn two_capability_groups_each_agree_and_their_differences_are_reported() -> TestResult {
    let reports = each_rank(4, |g| {
        let machine = if g.rank() < 2 { "avx512-machine" } else { "avx2-machine" };
        agree_by_capability(&on_machine(machine, "p"), g, false)
    });
    for r in reports {
        let r = r?;
        assert_eq!(r.groups["avx512-machine"], vec![0, 1]);
        assert_eq!(r.groups["avx2-machine"], vec![2, 3]);
        assert_eq!(r.differences.keys().collect::<Vec<_>>(), vec!["hardware"], "{r:?}");
    }
    Ok(())
}

#[test]
fn a_group_whose_ranks_differ_fails_every_rank_of_every_group() -> TestResult {
    let results = each_rank(4, |g| {
        let machine = if g.rank() < 2 { "a" } else { "b" };
        let policy = if g.rank() == 3 { "q" } else { "p" };
        agree_by_capability(&on_machine(machine, policy), g, false)
    });
    for r in results {
        let e = r.err().ok_or("every rank must fail")?;
        assert_eq!(e.kind(), ErrorKind::PlanMismatch);
        assert!(e.to_string().contains("policy: rank 2 has p; rank 3 has q"), "{e}");
    }
    Ok(())
}

#[test]
fn one_rank_asking_for_one_plan_makes_differences_between_groups_fail_everywhere() -> TestResult {
    let results = each_rank(4, |g| {
        let machine = if g.rank() % 2 == 0 { "a" } else { "b" };
        agree_by_capability(&on_machine(machine, "p"), g, g.rank() == 1)
    });
    for r in results {
        let e = r.err().ok_or("every rank must fail")?;
        assert!(e.to_string().contains("one_plan_across_ranks"), "{e}");
        assert!(e.to_string().contains("hardware: ranks 0,2 have a; ranks 1,3 have b"), "{e}");
    }
    Ok(())
}

#[test]
fn what_the_root_makes_reaches_every_rank_and_so_does_its_failure() -> TestResult {
    for r in each_rank(3, |g| from_root(g, 1, || Ok(b"table".to_vec()))) {
        assert_eq!(r?, b"table");
    }
    let failed =
        each_rank(3, |g| from_root(g, 0, || Err(Error::new(ErrorKind::Io, "the PerfDB at /x cannot be read"))));
    for r in failed {
        let e = r.err().ok_or("every rank hears of the root's failure")?;
        assert_eq!(e.kind(), ErrorKind::Io);
        assert_eq!(e.to_string(), "rank 0 failed: the PerfDB at /x cannot be read");
    }
    Ok(())
}

#[test]
fn every_rank_serves_the_table_the_root_solved() -> TestResult {
    let text = r#"{"schema_version": 1, "name": "root", "entries": [
      {"name": "rms", "request": {"op": "rms_norm", "tensors": {
          "x": {"dtype": "f32", "shape": [1, 64]}, "weight": {"dtype": "f32", "shape": [64]}}},
       "ranges": {"tokens": [1, 8]}}]}"#;
    let w = crate::plan::workload::Workload::from_json(text, "test")?;
    let served = each_rank(2, |g| {
        let lz = solve_on_root(LayerZero::planning("spr")?, &w, g, crate::PlanMode::Strict)?;
        lz.agreement_facts(Some(&w))
    });
    let served: Vec<Facts> = served.into_iter().collect::<Result<_>>()?;
    assert_ne!(served[0].items["table"], "none");
    assert_eq!(served[0], served[1]);
    Ok(())
}
