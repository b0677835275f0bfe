use anyhow::{Context as _, anyhow};
use aya_build::Toolchain;

/// Builds `node-diag-ebpf` for the BPF target; the object lands in `OUT_DIR` and is
/// embedded by `loader.rs` with `include_bytes_aligned!`.
fn main() -> anyhow::Result<()> {
    let cargo_metadata::Metadata { packages, .. } = cargo_metadata::MetadataCommand::new()
        .no_deps()
        .exec()
        .context("cargo metadata")?;
    let ebpf = packages
        .into_iter()
        .find(|p| p.name.as_str() == "node-diag-ebpf")
        .ok_or_else(|| anyhow!("node-diag-ebpf package not found in the workspace"))?;
    let root_dir = ebpf
        .manifest_path
        .parent()
        .ok_or_else(|| anyhow!("no parent for {}", ebpf.manifest_path))?;
    let package = aya_build::Package {
        name: ebpf.name.as_str(),
        root_dir: root_dir.as_str(),
        ..Default::default()
    };
    aya_build::build_ebpf([package], Toolchain::default())
}
