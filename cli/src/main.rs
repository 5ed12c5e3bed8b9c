//! The `lz` binary: see `lz --help`.

fn main() -> std::process::ExitCode {
    layerzero_cli::main()
}
