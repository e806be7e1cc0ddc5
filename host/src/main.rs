//! The `laurel` binary: everything lives in the library.

fn main() -> std::process::ExitCode {
    laurel::cli::main()
}
