//! The `lz` binary: see `lz --help`.

fn main() -> std::process::ExitCode {
    layerzero::cli::main()
}
