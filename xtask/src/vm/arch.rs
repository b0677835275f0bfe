//! The architectures the matrix boots, and what qemu, the kernel packages and the
//! guests need to know of each. Its own module so that every part of the matrix can
//! name an architecture without importing the matrix itself.

use std::fmt;

use serde::Serialize;

/// An architecture the matrix boots.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, clap::ValueEnum, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Arch {
    #[value(name = "x86_64")]
    X86_64,
    #[value(name = "aarch64")]
    Aarch64,
}

impl Arch {
    /// Debian's name for it (package suffixes, `dpkg --add-architecture`).
    pub fn debian(self) -> &'static str {
        match self {
            Self::X86_64 => "amd64",
            Self::Aarch64 => "arm64",
        }
    }

    /// Whether binaries built for the host run on it (this machine is x86_64).
    pub fn is_host(self) -> bool {
        self == Self::X86_64
    }

    /// The serial console of its qemu machine: the PC's first UART, or the virt
    /// machine's PL011 (built into Debian's arm64 kernel).
    pub fn console(self) -> &'static str {
        match self {
            Self::X86_64 => "ttyS0",
            Self::Aarch64 => "ttyAMA0",
        }
    }

    /// qemu's `-cpu` under TCG. On x86_64 the baseline `qemu64`: with `max`'s extensions
    /// Debian's kernel takes code paths (AVX copies and checksums, wider crypto) that TCG
    /// emulates at a higher cost, and a guest running the kernel subset used about 13 %
    /// more CPU; the agent and its programs need nothing beyond x86-64. On aarch64 `max`
    /// with a cheap pointer-authentication hash: emulating the architected QARMA
    /// algorithm on every call of Debian's kernel makes the guest ~2.5x slower.
    pub fn tcg_cpu(self) -> &'static str {
        match self {
            Self::X86_64 => "qemu64",
            Self::Aarch64 => "max,pauth-impdef=on",
        }
    }
}

impl fmt::Display for Arch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::X86_64 => "x86_64",
            Self::Aarch64 => "aarch64",
        })
    }
}
