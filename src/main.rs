//! The `heatsink` binary: parses the command line and hands over to the library.

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = heatsink::cli::Cli::parse();
    match heatsink::run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("heatsink: {e}");
            ExitCode::FAILURE
        }
    }
}
