//! `mpirun -np 4 lz readiness-check` (feature `mpi`): the ranks compare what they would serve,
//! and one rank with another policy fails the distributed check on every rank.

use std::process::Command;

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// Runs `mpirun` with `contexts` (each: rank count and lz's arguments); returns whether it
/// succeeded and what every rank printed.
fn mpirun(contexts: &[(u32, Vec<&str>)]) -> Result<(bool, String), Box<dyn std::error::Error>> {
    let lz = env!("CARGO_BIN_EXE_lz");
    let mut cmd = Command::new("mpirun");
    cmd.env("PMIX_MCA_gds", "hash");
    cmd.args(["--allow-run-as-root", "--oversubscribe", "--timeout", "120", "--tag-output"]);
    // Every rank exits 1 when the check fails: let each finish printing rather than abort the
    // job at the first.
    cmd.args(["--mca", "orte_abort_on_non_zero_status", "0"]);
    for (i, (n, args)) in contexts.iter().enumerate() {
        if i > 0 {
            cmd.arg(":");
        }
        cmd.args(["-np", &n.to_string(), lz]).args(args);
    }
    let out = cmd.output().map_err(|e| format!("mpirun could not start (is OpenMPI installed?): {e}"))?;
    Ok((out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned()))
}

fn distributed_lines(text: &str) -> Vec<&str> {
    text.lines().filter(|l| l.contains("distributed ")).collect()
}

#[test]
fn four_ranks_with_one_policy_pass_the_distributed_check() -> TestResult {
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("perfdb.sqlite");
    let db = db.to_str().ok_or("temp path is not UTF-8")?;
    let (_, text) = mpirun(&[(4, vec!["readiness-check", "--perfdb", db])])?;
    let lines = distributed_lines(&text);
    assert_eq!(lines.len(), 4, "{text}");
    assert!(
        lines.iter().all(|l| l.contains("ok   distributed") && l.contains("the 4 ranks serve the same kernels")),
        "{text}"
    );
    Ok(())
}

#[test]
fn one_rank_with_another_policy_fails_the_check_on_every_rank() -> TestResult {
    let dir = tempfile::tempdir()?;
    let policy = dir.path().join("deny.json");
    std::fs::write(&policy, r#"{"rules": [{"action": "deny", "kernels": "cpu.rms_norm.*"}]}"#)?;
    let policy = policy.to_str().ok_or("temp path is not UTF-8")?;
    let (_, text) = mpirun(&[(3, vec!["readiness-check"]), (1, vec!["readiness-check", "--policy", policy])])?;
    // mpirun's status is not each rank's: every rank says NOT READY (and exits 1).
    assert_eq!(text.lines().filter(|l| l.ends_with(":NOT READY")).count(), 4, "{text}");
    let lines = distributed_lines(&text);
    assert_eq!(lines.len(), 4, "{text}");
    for l in lines {
        assert!(l.contains("FAIL distributed") && l.contains("policy: ranks 0,1,2 have"), "{l}");
        assert!(l.contains("rank 3 has"), "{l}");
    }
    Ok(())
}
