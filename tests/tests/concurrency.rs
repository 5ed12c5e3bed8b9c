//! Concurrency and thread safety (E2E §16): one handle shared by many threads gives every
//! thread the answer a single thread gets, through cache hits and misses, plan hits and
//! policy swaps; and under random shapes its caches stay within their bound (§11.2).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use layerzero::model::dtype::DType;
use layerzero::model::op::Op;
use layerzero::model::request::Request;
use layerzero::model::tensor::TensorDesc;
use layerzero::plan::SelectionKey;
use layerzero::plan::solve::{self, Provenance};
use layerzero::plan::workload::Workload;
use layerzero::policy::Policy;
use layerzero::schema::{SchemaKind, violations};
use layerzero::{Hit, LayerZero, PlanMode, Result};
use layerzero_tests::{TestResult, attention, causal, lz, with_attrs};

const THREADS: usize = 16;
const PER_THREAD: usize = 100_000;
/// One selection in this many is of a size outside every bucket: selected live each time.
const LIVE_EVERY: usize = 2_000;

/// The plan covers causal bf16 prefill; everything else goes through the cache.
const PREFILL: &str = r#"{"schema_version": 1, "name": "concurrency", "entries": [
    {"name": "prefill", "request": {"op": "attention", "tensors": {
        "q": {"dtype": "bf16", "shape": [1, 16, 32, 128], "layout": "BSHD"},
        "k": {"dtype": "bf16", "shape": [1, 16, 8, 128], "layout": "BSHD"},
        "v": {"dtype": "bf16", "shape": [1, 16, 8, 128], "layout": "BSHD"}},
        "attrs": {"causal": true}}, "ranges": {"batch": [1, 2], "seq_q": [64, 1024], "seq_k": "seq_q"}}
]}"#;

/// What must not depend on threads: kernel, adaptations, exact score; or the error's kind.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Answer {
    Selected(usize, usize, u64),
    Failed(layerzero::ErrorKind),
}

fn answer(got: &Result<Hit<'_>>) -> Answer {
    match got {
        Ok(h) => Answer::Selected(h.index, h.transforms.len(), h.score.total_ns.to_bits()),
        Err(e) => Answer::Failed(e.kind()),
    }
}

fn rms_norm(dtype: DType, tokens: u64, hidden: u64) -> Request {
    Request::new(Op::RmsNorm)
        .tensor("x", TensorDesc::new(dtype, [tokens, hidden]))
        .tensor("weight", TensorDesc::new(dtype, [hidden]))
}

/// One request per (validity key, buckets), so no answer depends on which size of a bucket
/// was cached first: prefill the plan covers (and sizes it does not), decode, norms.
fn requests() -> Vec<Request> {
    let mut out = Vec::new();
    // Sizes inside their buckets, not at the edge the plan was solved for: a plan answer
    // differs from a live one (its score at least), so serving live where the plan should
    // serve is seen.
    for (batch, seq) in [(1, 100), (1, 200), (2, 1000), (1, 4000), (4, 100)] {
        out.push(with_attrs(attention(DType::BF16, batch, seq, seq, 32, 8, 128), causal()));
    }
    for seq_k in [128, 2048] {
        out.push(with_attrs(attention(DType::BF16, 1, 1, seq_k, 32, 8, 128), causal()));
        out.push(attention(DType::F16, 2, 1, seq_k, 16, 16, 64));
    }
    for (dtype, tokens) in [(DType::F32, 1), (DType::F32, 16), (DType::BF16, 512), (DType::F16, 8)] {
        out.push(rms_norm(dtype, tokens, 4096));
    }
    out
}

/// A handle planning for an H100, serving a plan solved under the default policy.
fn handle() -> TestResult<LayerZero> {
    let lz = LayerZero::planning("h100")?;
    let w = Workload::from_json(PREFILL, "prefill.json")?;
    let prov = Provenance { perfdb_digest: None, created_at: String::new(), command: "test".into() };
    let table = solve::solve(&w, &lz.selector(), prov)?;
    Ok(lz.with_plan(&table, PlanMode::Prefer)?)
}

/// Three ways in: a `Request`, a key derived once, and a probe with a live fallback.
fn select<'a>(lz: &'a LayerZero, way: usize, req: &Request, key: &SelectionKey) -> Result<Hit<'a>> {
    match way % 3 {
        0 => lz.select(req),
        1 => lz.select_keyed(key, req),
        _ => match lz.lookup(key) {
            Some(hit) => Ok(hit),
            None => lz.select_keyed(key, req),
        },
    }
}

/// Sets its flag when dropped, also while unwinding.
struct Stop<'a>(&'a AtomicBool);

impl Drop for Stop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

#[test]
fn sixteen_threads_through_policy_swaps_get_the_single_threaded_answer_every_time() -> TestResult {
    let mut reqs = requests();
    // Outside every bucket (more tokens than the axis's bound): never cached.
    reqs.push(rms_norm(DType::F32, (1 << 20) + 1, 64));
    let keys: Vec<SelectionKey> = reqs.iter().map(SelectionKey::derive).collect();
    let uncached = reqs.len() - 1;

    // Policy B denies what the default picks for prefill and for a norm.
    let lz = handle()?;
    let pick = |r: &Request| lz.select(r).map(|hit| hit.kernel.clone());
    let b = layerzero_tests::policy(&format!(
        r#"{{"rules": [{{"action": "deny", "kernels": "{}"}}, {{"action": "deny", "kernels": "{}"}}]}}"#,
        pick(&reqs[0])?,
        pick(&reqs[9])?
    ))?;
    let policies = [Policy::default(), b];

    // The single-threaded answers, per policy, on a handle of its own.
    let alone = handle()?;
    let mut expected: Vec<Vec<Answer>> = Vec::new();
    for p in &policies {
        alone.set_policy(p.clone())?;
        expected.push(reqs.iter().map(|r| answer(&alone.select(r))).collect());
    }
    let differ = (0..reqs.len()).filter(|&i| expected[0][i] != expected[1][i]).count();
    assert!(differ >= 2, "the policies must disagree somewhere, or a stale answer could not be seen");

    // Even: the policy `generation / 2 % 2` is in force; odd: a swap is under way.
    let generation = AtomicU64::new(0);
    let done = AtomicBool::new(false);
    let (checked, swaps) = std::thread::scope(|s| -> std::result::Result<_, String> {
        // Stops the swapper however the workers end: a failed check must not hang the test.
        let _stop = Stop(&done);
        let swapper = s.spawn(|| -> std::result::Result<u64, String> {
            let mut swaps = 0u64;
            while !done.load(Ordering::Acquire) {
                generation.fetch_add(1, Ordering::SeqCst);
                let next = policies[(swaps as usize + 1) % 2].clone();
                lz.set_policy(next).map_err(|e| e.to_string())?;
                generation.fetch_add(1, Ordering::SeqCst);
                swaps += 1;
                std::thread::sleep(std::time::Duration::from_micros(200));
            }
            Ok(swaps)
        });
        let workers: Vec<_> = (0..THREADS)
            .map(|t| {
                let (lz, reqs, keys, expected, generation) = (&lz, &reqs, &keys, &expected, &generation);
                s.spawn(move || {
                    // Selections checked against one policy's answer, per policy.
                    let mut exact = [0u64; 2];
                    for n in 0..PER_THREAD {
                        let i = if n % LIVE_EVERY == t { uncached } else { (n + t * 3) % uncached };
                        let before = generation.load(Ordering::SeqCst);
                        let got = answer(&select(lz, n + t, &reqs[i], &keys[i]));
                        let after = generation.load(Ordering::SeqCst);
                        if before == after && before % 2 == 0 {
                            let p = (before / 2 % 2) as usize;
                            assert_eq!(got, expected[p][i], "thread {t}, selection {n}: request {i} under policy {p}");
                            exact[p] += 1;
                        } else {
                            // A swap ran during the call: either policy's answer, nothing else.
                            assert!(
                                got == expected[0][i] || got == expected[1][i],
                                "thread {t}, selection {n}: request {i} got {got:?}, neither policy's answer"
                            );
                        }
                    }
                    exact
                })
            })
            .collect();
        let mut checked = [0u64; 2];
        for w in workers {
            let e = w.join().map_err(|_| "a selecting thread failed")?;
            checked = [checked[0] + e[0], checked[1] + e[1]];
        }
        drop(_stop);
        Ok((checked, swapper.join().map_err(|_| "the swapper panicked")??))
    })?;

    assert!(swaps >= 4, "the policy was swapped {swaps} times");
    assert!(checked[0] > 0 && checked[1] > 0, "answers checked per policy: {checked:?}");
    let c = lz.counters();
    assert!(c.plan_hits > 0 && c.plan_misses > 0, "{c:?}");
    assert!(c.cache_hits > 0 && c.cache_misses > 0 && c.uncacheable > 0, "{c:?}");
    // Every call is counted once: plan hit, cache hit, live selection, or a shared answer.
    let calls = (THREADS * PER_THREAD + 2) as u64;
    assert_eq!(c.plan_hits + c.cache_hits + c.live + c.shared, calls, "{c:?}");
    Ok(())
}

#[test]
fn threads_missing_one_key_at_once_agree_and_each_miss_is_selected_or_shared() -> TestResult {
    let req = with_attrs(attention(DType::BF16, 1, 512, 512, 32, 8, 128), causal());
    let alone = LayerZero::planning("h100")?;
    let want = answer(&alone.select(&req));
    for _ in 0..10 {
        let lz = LayerZero::planning("h100")?;
        let start = std::sync::Barrier::new(THREADS);
        std::thread::scope(|s| {
            for _ in 0..THREADS {
                s.spawn(|| {
                    start.wait();
                    assert_eq!(answer(&lz.select(&req)), want);
                });
            }
        });
        let c = lz.counters();
        assert_eq!(c.cache_hits + c.cache_misses, THREADS as u64, "{c:?}");
        // A miss selects live, or gets the answer of the thread selecting its key, or stops
        // waiting for it and selects live itself: never two of these, never none.
        assert_eq!(c.live + c.shared, c.cache_misses, "{c:?}");
        assert!(c.live >= 1 && c.wait_timeouts < c.live, "{c:?}");
    }
    Ok(())
}

fn bench(args: &[&str], capacity: Option<&str>) -> TestResult<(i32, serde_json::Value, String)> {
    let mut cmd = lz()?;
    cmd.arg("bench-select").args(args);
    if let Some(c) = capacity {
        cmd.env("LAYERZERO_CACHE_CAPACITY", c);
    }
    let out = cmd.output()?;
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let json = serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null);
    Ok((out.status.code().unwrap_or(-1), json, stderr))
}

#[test]
fn bench_select_under_random_shapes_keeps_the_cache_within_its_bound() -> TestResult {
    let (code, report, stderr) =
        bench(&["--threads", "1,4", "--seconds", "0.5", "--random-shapes", "--json"], Some("16"))?;
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(violations(SchemaKind::BenchSelectReport, &report)?, Vec::<String>::new());
    assert_eq!(report["deterministic"], true, "{report}");
    let rows = report["rows"].as_array().ok_or_else(|| format!("no rows in {report}"))?;
    assert_eq!(rows.iter().map(|r| r["threads"].as_u64()).collect::<Vec<_>>(), [Some(1), Some(4)]);
    for r in rows {
        let n = |f: &str| r[f].as_u64().ok_or_else(|| format!("{f}: {r}"));
        assert_eq!(n("cache_entry_bound")?, 32, "16 slots intern at most 32 decisions");
        assert_eq!(n("cache_entries")?, 32, "random shapes fill the cache to its bound, and no further: {r}");
        assert!(n("cache_misses")? > n("cache_hits")?, "most random shapes miss: {r}");
        assert!(n("selections")? > 0 && n("mismatches")? == 0, "{r}");
    }
    assert!(report["rss_kib"]["start"].is_u64() || report["rss_kib"]["start"].is_null());
    Ok(())
}

#[test]
fn bench_select_reads_a_workload_and_prints_a_row_per_thread_count() -> TestResult {
    let workload = layerzero_tests::repo_root().join("workloads/regret-cpu.json");
    let w = Workload::load(&workload)?;
    let points = w.points()?.len() as u64;
    let path = workload.display().to_string();
    let (code, report, stderr) = bench(&["--threads", "2", "--seconds", "0.2", "--workload", &path, "--json"], None)?;
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(report["requests"].as_u64(), Some(points), "one request per bucket of the workload");
    assert_eq!(report["rows"][0]["threads"], 2);
    assert_eq!(report["deterministic"], true);

    let out = lz()?.args(["bench-select", "--threads", "1", "--seconds", "0.1"]).output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0));
    assert!(text.contains("selections/s") && text.contains("determinism: all"), "{text}");
    assert!(text.contains("resident memory:"), "{text}");
    Ok(())
}

#[test]
fn bench_select_refuses_bad_thread_counts_and_durations_with_one_line_naming_the_flag() -> TestResult {
    for (args, flag) in [
        (["--threads", "0", "--seconds", "1"], "--threads 0"),
        (["--threads", "2", "--seconds", "0"], "--seconds 0"),
        (["--threads", "2", "--seconds", "NaN"], "--seconds NaN"),
    ] {
        let (code, _, stderr) = bench(&args, None)?;
        assert_eq!(code, 2, "{args:?}: {stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
        assert!(stderr.contains(flag), "{stderr}");
    }
    let (code, _, stderr) = bench(&["--threads", "2"], None)?;
    assert_eq!(code, 2, "--seconds is required: {stderr}");
    Ok(())
}
