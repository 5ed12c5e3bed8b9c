//! The `lz` command line as data: every command and its arguments (clap derives the
//! parser and the help text from these definitions and their doc comments).

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use super::tune;

/// LayerZero: selects the fastest valid kernel for an ML op on a machine, and says why.
#[derive(Parser, Debug)]
#[command(name = "lz", version, about, propagate_version = true)]
pub(super) struct Cli {
    #[command(subcommand)]
    pub(super) command: Command,
}

#[derive(Subcommand, Debug)]
pub(super) enum Command {
    /// Explain the selection for a request: the winner, then every candidate with its verdict.
    Explain(SelectArgs),
    /// Print the kernel id selected for a request (exit 1 when none qualifies).
    Which(SelectArgs),
    /// List the kernels of the catalog.
    ListKernels(ListArgs),
    /// Schema-check capability, hardware, policy and request files (all shipped files by default).
    Validate(ValidateArgs),
    /// Show a hardware profile (this host, detected, unless --hardware is given).
    Hardware(HardwareArgs),
    /// Check this installation: hardware, backends, files, one sample selection.
    Doctor(DoctorArgs),
    /// Print every reason code with its category and meaning.
    ReasonCodes(JsonArg),
    /// Run a request on this machine: load inputs, select (or force) a kernel, write outputs.
    Run(RunCmd),
    /// Check every executable kernel against cpu_reference over the case matrix.
    Parity(ParityArgs),
    /// Measure a workload's kernels on this machine into the PerfDB; --verify reports the regret.
    Tune(tune::TuneArgs),
    /// Bake a dispatch table: a decision for every bucket of a workload (PerfDB-backed when
    /// measurements exist).
    Solve(SolveCmd),
    /// Is this machine ready to serve? Schemas, table vs. host, kernels, coverage, PerfDB.
    /// Exit 0 ready, 1 not ready (every failure names its fix), 2 usage error.
    ReadinessCheck(ReadinessCmd),
    /// Compile (JIT) every kernel a workload's or table's buckets select, for every size of
    /// each bucket; --verify dispatches another size per bucket and checks nothing compiles.
    /// Exit 1 when a bucket could not be warmed or the verification compiled.
    Warmup(WarmupCmd),
    /// Generate text with a Hugging Face model folder; every op is selected and dispatched by
    /// LayerZero. Exit 2 on a bad model, prompt or option.
    Generate(Box<GenerateCmd>),
    /// Classify an image with a Hugging Face ViT folder; every op (patch embedding, blocks,
    /// classifier) is selected and dispatched by LayerZero. Exit 2 on a bad model, image or
    /// option.
    Classify(ClassifyCmd),
    /// Write the workload of a model (every op it dispatches, with perf-axis ranges) for
    /// `lz tune`, `lz solve` and `lz readiness-check`.
    Workload(WorkloadCmd),
    /// Compare two dumps (safetensors) name by name and name the first stage that diverges.
    /// Exit 0 within thresholds, 1 divergence, 2 usage error or missing tensors.
    Diff(DiffCmd),
    /// Write the artifacts of this machine's handle into a new folder: capabilities and hash,
    /// the loaded dispatch table and its validation, a PerfDB copy, recent selection logs,
    /// policy, health and counters.
    Snapshot(SnapshotCmd),
    /// Selection throughput from N threads sharing one handle, every answer checked against
    /// the single-threaded one, and resident memory sampled over the run (soak, §11.2). Exit 1
    /// if an answer differs or memory grows past --max-rss-growth-mb after the warm-up.
    BenchSelect(BenchSelectCmd),
    /// Pin a plugin in the lockfile: open it (every check but the lock), then add or update
    /// its entry (name, version, source, blake3 of the library and of its capabilities).
    Lock(LockCmd),
    /// The lockfile's plugins: `list` shows them, `verify` checks each against its file
    /// (exit 1 naming every plugin that no longer matches).
    Plugin(PluginCmd),
}

#[derive(Args, Debug)]
pub(super) struct LockCmd {
    /// The plugin library to pin.
    #[arg(long, value_name = "PATH")]
    pub(super) plugin: PathBuf,
    /// The lockfile (default $LAYERZERO_LOCK, else ./layerzero.lock).
    #[arg(long, value_name = "FILE")]
    pub(super) lock: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub(super) struct PluginCmd {
    #[command(subcommand)]
    pub(super) action: PluginAction,
}

#[derive(Subcommand, Debug)]
pub(super) enum PluginAction {
    /// Each locked plugin: namespace, file, hashes, source.
    List(PluginListArgs),
    /// Check every locked plugin against its file; exit 1 naming each that does not match.
    Verify(PluginListArgs),
    /// Install a plugin from a hub repository folder (`REPO/build/<variant>/metadata.json`):
    /// the variant this host loads, every other one explained; the library is copied into
    /// $LAYERZERO_HOME/plugins, opened and locked (a first add pins and prints its hash).
    Add(PluginAddArgs),
}

#[derive(Args, Debug)]
pub(super) struct PluginAddArgs {
    /// The hub repository: a folder with build/<variant>/ inside, or an http:// URL of one
    /// (whose build/index.json lists the variants).
    #[arg(value_name = "REPO")]
    pub(super) repo: String,
    /// Refuse the download unless its blake3 is this (hex).
    #[arg(long, value_name = "BLAKE3")]
    pub(super) expect_hash: Option<String>,
    /// The Python interpreter whose environment a Python package variant is installed into
    /// (default: the active virtual environment's, else python3 on PATH).
    #[arg(long, value_name = "PATH")]
    pub(super) python: Option<PathBuf>,
    /// The lockfile (default $LAYERZERO_LOCK, else ./layerzero.lock).
    #[arg(long, value_name = "FILE")]
    pub(super) lock: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub(super) struct PluginListArgs {
    /// The lockfile (default $LAYERZERO_LOCK, else ./layerzero.lock).
    #[arg(long, value_name = "FILE")]
    pub(super) lock: Option<PathBuf>,
    /// Machine-readable output.
    #[arg(long)]
    pub(super) json: bool,
}

#[derive(Args, Debug)]
#[command(group = clap::ArgGroup::new("source").required(true).multiple(true).args(["workload", "table"]))]
pub(super) struct WarmupCmd {
    /// Warm every bucket of this workload (selected through the table when one is given).
    #[arg(long, value_name = "FILE")]
    pub(super) workload: Option<PathBuf>,
    /// Serve selections from this dispatch table; without --workload, warm its entries.
    #[arg(long, value_name = "FILE")]
    pub(super) table: Option<PathBuf>,
    /// Then dispatch a request at the smallest size of each bucket and count what compiles.
    #[arg(long)]
    pub(super) verify: bool,
    /// Machine-readable output.
    #[arg(long)]
    pub(super) json: bool,
}

#[derive(Args, Debug)]
pub(super) struct SnapshotCmd {
    /// The folder to write (created; an existing one must be empty).
    #[arg(value_name = "DIR")]
    pub(super) dir: PathBuf,
    /// Select every request of this workload first, so the selection log shows its decisions
    /// (and, with the `otel` feature, `trace.json` their `lz.select` spans as OTLP/JSON).
    #[arg(long, value_name = "FILE")]
    pub(super) workload: Option<PathBuf>,
    /// PerfDB file to copy (default $LAYERZERO_PERFDB, else $LAYERZERO_HOME/perfdb.sqlite).
    #[arg(long, value_name = "FILE")]
    pub(super) perfdb: Option<PathBuf>,
    /// Machine-readable output.
    #[arg(long)]
    pub(super) json: bool,
}

#[derive(Args, Debug)]
pub(super) struct BenchSelectCmd {
    /// Thread counts, comma-separated: one row each (1,2,16).
    #[arg(long, value_name = "N[,N...]", value_delimiter = ',', required = true)]
    pub(super) threads: Vec<usize>,
    /// Seconds each row runs.
    #[arg(long, value_name = "S")]
    pub(super) seconds: f64,
    /// Select the buckets of this workload file (default: a built-in mixed set).
    #[arg(long, value_name = "FILE")]
    pub(super) workload: Option<PathBuf>,
    /// Draw shapes at random (seeded) from a pool larger than the cache, so most selections miss.
    #[arg(long)]
    pub(super) random_shapes: bool,
    /// Soak bound: exit 1 if resident memory, sampled over the run, peaks more than this many
    /// MiB above its peak during the warm-up (the first quarter of the run).
    #[arg(long, value_name = "MB", default_value_t = super::soak::DEFAULT_MAX_GROWTH_MB)]
    pub(super) max_rss_growth_mb: f64,
    /// Machine-readable output (schemas/bench_select_report.schema.json).
    #[arg(long)]
    pub(super) json: bool,
}

#[derive(Args, Debug)]
pub(super) struct GenerateCmd {
    /// The model folder (config.json and *.safetensors; tokenizer.json for --prompt).
    #[arg(long, value_name = "DIR")]
    pub(super) model: PathBuf,
    /// Refuse to run unless the folder's tokenizer.json has this identity hash (as
    /// `--json` reports it; a prefix of at least 12 hex digits will do).
    #[arg(long, value_name = "HASH")]
    pub(super) tokenizer_hash: Option<String>,
    /// The prompt as text (needs the folder's tokenizer.json).
    #[arg(long, conflicts_with_all = ["prompt_ids", "prompts"], required_unless_present_any = ["prompt_ids", "prompts"])]
    pub(super) prompt: Option<String>,
    /// The prompt as token ids, comma-separated.
    #[arg(long, value_name = "IDS", value_delimiter = ',', conflicts_with = "prompts")]
    pub(super) prompt_ids: Option<Vec<u32>>,
    /// Several prompts, generated together: a JSON array whose items are text (a string) or
    /// token ids (an array of integers).
    #[arg(long, value_name = "FILE")]
    pub(super) prompts: Option<PathBuf>,
    /// The KV cache: contiguous (one prompt) or paged (default with several prompts).
    #[arg(long, value_name = "contiguous|paged")]
    pub(super) kv: Option<String>,
    /// Positions per page of the paged KV cache.
    #[arg(long, default_value_t = 16)]
    pub(super) page_size: usize,
    /// Tokens to generate at most.
    #[arg(long, default_value_t = 32)]
    pub(super) max_new_tokens: usize,
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.0)]
    pub(super) temperature: f64,
    /// Keep the k most probable tokens when sampling.
    #[arg(long)]
    pub(super) top_k: Option<u64>,
    /// Keep the smallest set of tokens whose probability reaches p when sampling.
    #[arg(long)]
    pub(super) top_p: Option<f64>,
    /// Sampler seed.
    #[arg(long, default_value_t = 0)]
    pub(super) seed: u64,
    /// Compute dtype (default: the weights' dtype).
    #[arg(long, value_name = "f32|bf16")]
    pub(super) dtype: Option<String>,
    /// Quantize the decoder's projections (q, k, v, o, gate, up, down) at load, in blocks of
    /// --group-size input features with one scale each: int8 (llama.cpp Q8_0's layout; each
    /// input row quantized in the same blocks by a `quantize` dispatch, then `linear_w8a8`)
    /// or int4 (Q4_0's arithmetic, `linear_int4`; activations per --activations). Embeddings,
    /// norms and lm_head stay in the compute dtype.
    #[arg(long, value_name = "int8|int4")]
    pub(super) weights: Option<String>,
    /// Input features per scale of --weights (default 32, Q8_0's and Q4_0's block; even for
    /// int4; it must divide every projection's input size).
    #[arg(long, value_name = "G", requires = "weights")]
    pub(super) group_size: Option<usize>,
    /// How --weights int4 takes the activations: int8 (default; rounded in the same blocks
    /// inside `linear_int4`, as llama.cpp's Q4_0 takes Q8_0 activations, and dotted in
    /// integers) or f32 (as given: slower, closer to the f32 model). int8 weights always
    /// take int8 activations.
    #[arg(long, value_name = "int8|f32", requires = "weights")]
    pub(super) activations: Option<String>,
    /// Keep generating after an end-of-sequence token.
    #[arg(long)]
    pub(super) ignore_eos: bool,
    /// Serve selections from this dispatch table.
    #[arg(long, value_name = "FILE")]
    pub(super) table: Option<PathBuf>,
    /// Speculative decoding: this model (same vocabulary and tokenizer) drafts tokens that
    /// the target verifies; the tokens are the target's (greedy: exactly; sampling: in
    /// distribution). Also runs the target alone to report the speed-up.
    #[arg(long, value_name = "DIR", conflicts_with_all = ["prompts", "dump"])]
    pub(super) draft: Option<PathBuf>,
    /// Tokens the draft proposes per round.
    #[arg(long, value_name = "K", default_value_t = 4, requires = "draft")]
    pub(super) draft_tokens: usize,
    /// Encoder-decoder models: recompute the decoder over every token each step instead of
    /// keeping its caches (a check that they give the same tokens; slow).
    #[arg(long)]
    pub(super) no_kv_cache: bool,
    /// Soak mode: generate the same prompts again and again for this many seconds, sampling
    /// resident memory; exit 1 if it grows past --max-rss-growth-mb after the warm-up (the
    /// first quarter) or greedy tokens differ between rounds.
    #[arg(long, value_name = "S", conflicts_with_all = ["draft", "dump"])]
    pub(super) seconds: Option<f64>,
    /// Soak bound of --seconds, in MiB.
    #[arg(long, value_name = "MB", default_value_t = super::soak::DEFAULT_MAX_GROWTH_MB, requires = "seconds")]
    pub(super) max_rss_growth_mb: f64,
    /// Write hidden states, per-layer stages and logits as safetensors into DIR (dump.safetensors).
    #[arg(long, value_name = "DIR")]
    pub(super) dump: Option<PathBuf>,
    /// Time every dispatch and report where each phase's time went, per op: selection,
    /// kernels, the rest of the dispatch, bytes against the measured copy bandwidth, time
    /// outside any dispatch (measures this machine first if `lz hardware --measure` has not).
    #[arg(long)]
    pub(super) profile: bool,
    /// Shadow-check every N-th call of each kernel against the reference (cpu_reference on
    /// --verify-rows rows of the same inputs) while generating, and report per layer the
    /// lowest cosine; a kernel that diverges is quarantined, its call falls back, and the
    /// layer is named (exit 1).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub(super) verify_every: Option<u32>,
    /// Rows compared per checked call with --verify-every.
    #[arg(long, value_name = "R", default_value_t = 4, requires = "verify_every",
          value_parser = clap::value_parser!(u32).range(1..))]
    pub(super) verify_rows: u32,
    /// Machine-readable output (schemas/generate_report.schema.json).
    #[arg(long)]
    pub(super) json: bool,
}

#[derive(Args, Debug)]
pub(super) struct ClassifyCmd {
    /// The model folder (config.json, *.safetensors, optional preprocessor_config.json).
    #[arg(long, value_name = "DIR")]
    pub(super) model: PathBuf,
    /// The image: .png or .ppm (8-bit, the model's size; preprocessed as the folder's
    /// preprocessor_config.json says) or .safetensors (`pixel_values` [1, C, H, W]).
    #[arg(long, value_name = "FILE")]
    pub(super) image: PathBuf,
    /// Classes to print, most probable first.
    #[arg(long, default_value_t = 5)]
    pub(super) top: usize,
    /// Compute dtype (default: the weights' dtype).
    #[arg(long, value_name = "f32|bf16")]
    pub(super) dtype: Option<String>,
    /// Write every stage (patch_embed, hidden states, layers, pooled, logits) as safetensors
    /// into DIR (dump.safetensors), for `lz diff`.
    #[arg(long, value_name = "DIR")]
    pub(super) dump: Option<PathBuf>,
    /// Machine-readable output.
    #[arg(long)]
    pub(super) json: bool,
}

#[derive(Args, Debug)]
pub(super) struct WorkloadCmd {
    /// The model folder (only config.json is read).
    #[arg(long, value_name = "DIR")]
    pub(super) model: PathBuf,
    /// Most sequences decoded together.
    #[arg(long, default_value_t = 8)]
    pub(super) max_batch: usize,
    /// Longest sequence, prompt and generated tokens.
    #[arg(long, default_value = None)]
    pub(super) max_seq: Option<usize>,
    /// Positions per page of the paged KV cache.
    #[arg(long, default_value_t = 16)]
    pub(super) page_size: usize,
    /// Compute dtype (default: the config's dtype, else f32).
    #[arg(long, value_name = "f32|bf16")]
    pub(super) dtype: Option<String>,
    /// Write the workload here instead of standard output.
    #[arg(long, value_name = "FILE")]
    pub(super) out: Option<PathBuf>,
    /// The workload of one rank of N tensor-parallel ranks: heads, key/value heads (replicated
    /// when fewer than N) and the MLP inner size divided by N.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub(super) tp: usize,
}

#[derive(Args, Debug)]
pub(super) struct DiffCmd {
    /// Our dump (a safetensors file, or a folder holding dump.safetensors).
    #[arg(value_name = "OURS")]
    pub(super) ours: PathBuf,
    /// The reference dump (e.g. from tools/hf_reference.py).
    #[arg(value_name = "REFERENCE")]
    pub(super) reference: PathBuf,
    /// Largest L2-relative error a stage may have.
    #[arg(long, default_value_t = 1e-3)]
    pub(super) threshold: f64,
    /// Machine-readable output (schemas/diff_report.schema.json).
    #[arg(long)]
    pub(super) json: bool,
}

#[derive(Args, Debug)]
pub(super) struct SolveCmd {
    /// The workload file (schemas/workload.schema.json).
    #[arg(long, value_name = "FILE")]
    pub(super) workload: PathBuf,
    /// Solve for a named hardware profile or a profile file instead of this host.
    #[arg(long, value_name = "NAME|PATH")]
    pub(super) hardware: Option<String>,
    /// Policy file.
    #[arg(long, value_name = "FILE")]
    pub(super) policy: Option<PathBuf>,
    /// PerfDB file (default $LAYERZERO_PERFDB, else $LAYERZERO_HOME/perfdb.sqlite).
    #[arg(long, value_name = "FILE", conflicts_with = "no_perfdb")]
    pub(super) perfdb: Option<PathBuf>,
    /// Use the cost model only, ignoring any PerfDB.
    #[arg(long)]
    pub(super) no_perfdb: bool,
    /// Where to write the table.
    #[arg(long, value_name = "FILE")]
    pub(super) out: PathBuf,
    #[command(flatten)]
    pub(super) catalog: CatalogArg,
    /// Machine-readable output.
    #[arg(long)]
    pub(super) json: bool,
}

#[derive(Args, Debug)]
pub(super) struct ReadinessCmd {
    /// The dispatch table to serve with.
    #[arg(long, value_name = "FILE")]
    pub(super) table: Option<PathBuf>,
    /// The policy to serve with.
    #[arg(long, value_name = "FILE")]
    pub(super) policy: Option<PathBuf>,
    /// The workload whose buckets the table must cover.
    #[arg(long, value_name = "FILE")]
    pub(super) workload: Option<PathBuf>,
    /// PerfDB file (default $LAYERZERO_PERFDB, else $LAYERZERO_HOME/perfdb.sqlite).
    #[arg(long, value_name = "FILE")]
    pub(super) perfdb: Option<PathBuf>,
    /// Fail unless every kernel of the table that compiles at first use is warm for every
    /// size of its buckets (as the policy's `require_warm` does).
    #[arg(long)]
    pub(super) require_warm: bool,
    /// Warm the table's JIT kernels up first, as a serving process does at start.
    #[arg(long)]
    pub(super) warmup: bool,
    #[command(flatten)]
    pub(super) catalog: CatalogArg,
    /// Machine-readable output.
    #[arg(long)]
    pub(super) json: bool,
}

#[derive(Args, Debug)]
pub(super) struct RunCmd {
    /// Request file (JSON), or - for standard input.
    #[arg(long, value_name = "FILE|-")]
    pub(super) request: String,
    /// Input tensors (safetensors), named as in the request.
    #[arg(long, value_name = "IN.safetensors")]
    pub(super) inputs: PathBuf,
    /// Where to write the outputs (`out`; RoPE also `out_k`).
    #[arg(long, value_name = "OUT.safetensors")]
    pub(super) out: PathBuf,
    /// Run this kernel (it must still pass every check).
    #[arg(long, value_name = "ID")]
    pub(super) kernel: Option<String>,
    /// Policy file.
    #[arg(long, value_name = "FILE")]
    pub(super) policy: Option<PathBuf>,
    /// Run the kernel N more times and report the median time.
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub(super) repeat: usize,
    /// Serve the selection from this dispatch table (`lz solve`); a miss selects live.
    /// Default: $LAYERZERO_DISPATCH_TABLE.
    #[arg(long, value_name = "FILE")]
    pub(super) table: Option<PathBuf>,
    /// How to use the table: prefer (live on a miss or mismatch), strict (refuse), off.
    /// Default: $LAYERZERO_PLAN_MODE, else prefer.
    #[arg(long, value_name = "MODE")]
    pub(super) plan_mode: Option<layerzero::runtime::PlanMode>,
    /// Write the run's `lz.select` and `lz.dispatch` spans to this file as OTLP/JSON
    /// (OpenTelemetry; builds with the `otel` feature, the default). While it records, the
    /// `LAYERZERO_LOG` log is not written.
    #[arg(long, value_name = "TRACE.json")]
    pub(super) trace: Option<PathBuf>,
    #[command(flatten)]
    pub(super) catalog: CatalogArg,
    /// Machine-readable output.
    #[arg(long)]
    pub(super) json: bool,
}

#[derive(Args, Debug)]
pub(super) struct ParityArgs {
    /// Only this op.
    #[arg(long)]
    pub(super) op: Option<String>,
    /// Only this kernel.
    #[arg(long, value_name = "ID")]
    pub(super) kernel: Option<String>,
    /// Store each compared (kernel, case) as this machine's parity record in the PerfDB.
    #[arg(long)]
    pub(super) record: bool,
    /// PerfDB file to record into (default $LAYERZERO_PERFDB, else $LAYERZERO_HOME/perfdb.sqlite).
    #[arg(long, value_name = "FILE", requires = "record")]
    pub(super) perfdb: Option<PathBuf>,
    #[command(flatten)]
    pub(super) catalog: CatalogArg,
    /// Machine-readable output.
    #[arg(long)]
    pub(super) json: bool,
}

#[derive(Args, Debug)]
pub(super) struct JsonArg {
    /// Machine-readable output.
    #[arg(long)]
    pub(super) json: bool,
}

#[derive(Args, Debug)]
pub(super) struct CatalogArg {
    /// Read capability files from this folder instead of the shipped ones.
    #[arg(long, value_name = "DIR")]
    pub(super) capabilities: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub(super) struct SelectArgs {
    /// Request file (JSON), or - for standard input.
    #[arg(long, value_name = "FILE|-")]
    pub(super) request: String,
    /// Plan for a named hardware profile or a profile file instead of this host.
    #[arg(long, value_name = "NAME|PATH")]
    pub(super) hardware: Option<String>,
    /// Policy file.
    #[arg(long, value_name = "FILE")]
    pub(super) policy: Option<PathBuf>,
    #[command(flatten)]
    pub(super) catalog: CatalogArg,
    /// Machine-readable output.
    #[arg(long)]
    pub(super) json: bool,
}

#[derive(Args, Debug)]
pub(super) struct ListArgs {
    /// Only kernels of this op.
    #[arg(long)]
    pub(super) op: Option<String>,
    /// Only kernels of this backend.
    #[arg(long)]
    pub(super) backend: Option<String>,
    #[command(flatten)]
    pub(super) catalog: CatalogArg,
    /// Machine-readable output.
    #[arg(long)]
    pub(super) json: bool,
}

#[derive(Args, Debug)]
pub(super) struct ValidateArgs {
    /// Files to check; the kind is read from the path or the content.
    pub(super) files: Vec<PathBuf>,
    /// Machine-readable output.
    #[arg(long)]
    pub(super) json: bool,
}

#[derive(Args, Debug)]
pub(super) struct HardwareArgs {
    /// A named profile or a profile file instead of this host.
    #[arg(long, value_name = "NAME|PATH")]
    pub(super) hardware: Option<String>,
    /// List the shipped profile names.
    #[arg(long)]
    pub(super) list: bool,
    /// Measure this host's copy bandwidth and multiply-add rates (under LAYERZERO_CPU_ISA),
    /// store them in $LAYERZERO_HOME/hardware.json, and show them next to the nominal ones.
    #[arg(long, conflicts_with_all = ["hardware", "list"])]
    pub(super) measure: bool,
    /// Machine-readable output.
    #[arg(long)]
    pub(super) json: bool,
}

#[derive(Args, Debug)]
pub(super) struct DoctorArgs {
    #[command(flatten)]
    pub(super) catalog: CatalogArg,
    /// Check this PerfDB file instead of $LAYERZERO_PERFDB (default $LAYERZERO_HOME/perfdb.sqlite).
    #[arg(long, value_name = "FILE")]
    pub(super) perfdb: Option<PathBuf>,
    /// Machine-readable output.
    #[arg(long)]
    pub(super) json: bool,
}
