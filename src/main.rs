//! `scarab`: parse, dispatch, print the error once. Everything else is in the library.

fn main() -> std::process::ExitCode {
    scarab::cli::main()
}
