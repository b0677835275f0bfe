use which::which;

/// Rebuild when the bpf-linker binary changes: cargo cannot express the dependency on it.
fn main() {
    match which("bpf-linker") {
        Ok(path) => println!("cargo:rerun-if-changed={}", path.display()),
        Err(err) => println!(
            "cargo:warning=bpf-linker not found on PATH ({err}); run `cargo xtask prereqs`"
        ),
    }
}
