//! The `dsh` command line.

fn main() {
    println!("dsh {}", env!("CARGO_PKG_VERSION"));
}
