//! Agreement over MPI (feature `mpi`): each test launches itself under `mpirun -np 4`, and the
//! four ranks run the test's body over `MpiGroup`. The launcher checks what every rank printed
//! and mpirun's exit status (a rank whose body fails exits non-zero and mpirun stops the job).

use std::process::Command;
use std::time::Instant;

use layerzero::distributed::mpi::MpiGroup;
use layerzero::distributed::{Collective, solve_on_root};
use layerzero::error::ErrorKind;
use layerzero::plan::workload::Workload;
use layerzero::policy::Policy;
use layerzero::{LayerZero, PlanMode};
use mpi::topology::SimpleCommunicator;
use mpi::traits::Communicator;

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// Set in the ranks' environment: this process is a rank, not the launcher.
const CHILD: &str = "LZ_TEST_MPI_CHILD";

/// Runs `test` on 4 ranks; `env` adds variables to the first two ranks only (a second
/// capability group). Returns what the ranks printed.
fn launch(test: &str, env: &[(&str, &str)]) -> Result<String, Box<dyn std::error::Error>> {
    // One job at a time: concurrent OpenMPI jobs on one machine oversubscribe it further.
    static ONE_JOB: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _job = ONE_JOB.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let exe = std::env::current_exe()?;
    let exe = exe.to_str().ok_or("the test binary's path is not UTF-8")?;
    let body = [exe, test, "--exact", "--nocapture", "--test-threads=1"];
    let mut cmd = Command::new("mpirun");
    // PMIx's shared-memory store fails in some containers (its segment cannot be mapped);
    // the hash store works everywhere.
    cmd.env("PMIX_MCA_gds", "hash");
    // Root under CI; four ranks on a two-core machine; a hung job is killed, not waited on.
    cmd.args(["--allow-run-as-root", "--oversubscribe", "--timeout", "120"]);
    // `-x` belongs to an app context: each context marks its ranks as ranks.
    let child = format!("{CHILD}=1");
    if env.is_empty() {
        cmd.args(["-x", &child, "-np", "4"]).args(body);
    } else {
        let vars: Vec<String> = env.iter().map(|(k, v)| format!("{k}={v}")).collect();
        cmd.args(["-x", &child, "-np", "2", "env"]).args(&vars).args(body);
        cmd.args([":", "-x", &child, "-np", "2"]).args(body);
    }
    let out = cmd.output().map_err(|e| format!("mpirun could not start (is OpenMPI installed?): {e}"))?;
    // A rank's own libtest summary is not this test's: keep it out of the totals CI adds up.
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
        .replace("test result:", "rank result:");
    if !out.status.success() {
        return Err(format!("mpirun failed ({}):\n{text}", out.status).into());
    }
    Ok(text)
}

/// How many of the 4 ranks printed "`tag` rank <r>" (the ranks' prints may share a line).
fn ranks_saying(text: &str, tag: &str) -> usize {
    (0..4).filter(|r| text.contains(&format!("{tag} rank {r}"))).count()
}

/// The 16-digit hashes printed after "table ".
fn tables(text: &str) -> std::collections::BTreeSet<&str> {
    text.split("table ").skip(1).filter_map(|rest| rest.get(..16)).collect()
}

fn is_child() -> bool {
    std::env::var_os(CHILD).is_some()
}

/// A rank's side: MPI up, `body` over the world. A failing rank aborts the job, since
/// finalizing MPI would wait for the ranks still inside a collective.
fn rank(body: impl FnOnce(&MpiGroup<SimpleCommunicator>) -> TestResult) -> TestResult {
    let universe = mpi::initialize().ok_or("MPI was already initialized")?;
    let group = MpiGroup::new(universe.world());
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| body(&group)));
    match outcome {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => {
            eprintln!("rank {} failed: {e}", group.rank());
            group.communicator().abort(1)
        }
        Err(_) => {
            eprintln!("rank {} panicked", group.rank());
            group.communicator().abort(1)
        }
    }
}

/// A workload small enough to solve in a test: two ops, a few buckets each.
fn workload() -> Result<Workload, Box<dyn std::error::Error>> {
    let text = r#"{"schema_version": 1, "name": "mpi-agreement", "entries": [
      {"name": "rms_norm", "request": {"op": "rms_norm", "tensors": {
          "x": {"dtype": "f32", "shape": [1, 512]}, "weight": {"dtype": "f32", "shape": [512]}}},
       "ranges": {"tokens": [1, 256]}},
      {"name": "linear", "request": {"op": "linear", "tensors": {
          "x": {"dtype": "f32", "shape": [1, 512]}, "weight": {"dtype": "f32", "shape": [512, 512], "layout": "NT"}}},
       "ranges": {"m": [1, 256]}}]}"#;
    Ok(Workload::from_json(text, "the MPI test's workload")?)
}

#[test]
fn four_ranks_serve_the_roots_plan_and_agree_on_every_bucket() -> TestResult {
    if !is_child() {
        let text = launch("four_ranks_serve_the_roots_plan_and_agree_on_every_bucket", &[])?;
        assert_eq!(ranks_saying(&text, "agreed"), 4, "every rank agrees:\n{text}");
        assert_eq!(tables(&text).len(), 1, "every rank serves the root's table:\n{text}");
        return Ok(());
    }
    rank(|group| {
        let w = workload()?;
        let started = Instant::now();
        let lz = solve_on_root(LayerZero::detected()?, &w, group, PlanMode::Strict)?;
        let took = started.elapsed();
        let table = lz.table().ok_or("no table loaded")?;
        assert!(table.unsolved.is_empty(), "every bucket solved: {:?}", table.unsolved);
        let facts = lz.agreement_facts(Some(&w))?;
        println!(
            "agreed rank {} of {}: {} buckets in {:.1} ms, table {}",
            group.rank(),
            group.size(),
            facts.items.keys().filter(|k| k.starts_with("bucket:")).count(),
            took.as_secs_f64() * 1e3,
            facts.items["table"]
        );
        Ok(())
    })
}

#[test]
fn a_rank_with_another_policy_fails_every_rank_naming_the_bucket() -> TestResult {
    if !is_child() {
        let text = launch("a_rank_with_another_policy_fails_every_rank_naming_the_bucket", &[])?;
        assert_eq!(ranks_saying(&text, "refused"), 4, "every rank fails, none hangs:\n{text}");
        return Ok(());
    }
    rank(|group| {
        let w = workload()?;
        let lz = LayerZero::detected()?;
        // The kernel every rank picks for the first bucket; rank 1 denies it.
        let facts = lz.agreement_facts(Some(&w))?;
        let (bucket, kernel) = facts.items.iter().find(|(k, _)| k.starts_with("bucket:")).ok_or("no bucket")?;
        let lz = if group.rank() == 1 {
            let rule = format!(r#"{{"rules": [{{"action": "deny", "kernels": "{kernel}"}}]}}"#);
            lz.with_policy(Policy::from_json(&rule, "rank 1's policy")?)?
        } else {
            lz
        };
        let err = lz.agree(group, Some(&w)).err().ok_or("the ranks agreed despite rank 1's policy")?;
        assert_eq!(err.kind(), ErrorKind::PlanMismatch);
        let message = err.to_string();
        assert!(message.contains(bucket.as_str()) && message.contains("rank 1 has"), "{message}");
        assert!(message.contains("policy: ranks 0,2,3 have"), "{message}");
        println!("refused rank {}: {message}", group.rank());
        Ok(())
    })
}

#[test]
fn two_capability_groups_each_agree_and_one_plan_across_them_fails() -> TestResult {
    if !is_child() {
        let text = launch(
            "two_capability_groups_each_agree_and_one_plan_across_them_fails",
            &[("LAYERZERO_CPU_ISA", "portable")],
        )?;
        assert_eq!(ranks_saying(&text, "groups"), 4, "every rank reports the two groups:\n{text}");
        assert_eq!(ranks_saying(&text, "one plan refused"), 4, "one plan fails on every rank:\n{text}");
        return Ok(());
    }
    rank(|group| {
        let w = workload()?;
        let lz = LayerZero::detected()?;
        let report = lz.agree_by_capability(group, Some(&w))?;
        let members: Vec<&Vec<usize>> = report.groups.values().collect();
        assert_eq!(report.groups.len(), 2, "{report:?}");
        assert!(members.contains(&&vec![0, 1]) && members.contains(&&vec![2, 3]), "{report:?}");
        assert!(report.differences.contains_key("hardware"), "{report:?}");
        println!("groups rank {}: {:?}; differing: {:?}", group.rank(), members, report.differences.keys());
        // One rank's wish for one plan is every rank's.
        let policy = Policy { one_plan_across_ranks: group.rank() == 3, ..Policy::default() };
        let lz = lz.with_policy(policy)?;
        let err = lz.agree_by_capability(group, Some(&w)).err().ok_or("one plan across two machines was accepted")?;
        assert_eq!(err.kind(), ErrorKind::PlanMismatch);
        assert!(err.to_string().contains("one_plan_across_ranks"), "{err}");
        println!("one plan refused rank {}: {err}", group.rank());
        Ok(())
    })
}
