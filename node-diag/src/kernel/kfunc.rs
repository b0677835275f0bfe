//! Kernel function (kfunc) calls in the eBPF object. aya's loader relocates helper and
//! BPF-to-BPF calls but not kfunc calls, so the programs call a helper id no kernel has
//! ([`KFUNC_RDONLY_CAST_MARK`]) and [`resolve`] rewrites each such call in the object's
//! code before aya parses it: into a kfunc call (`src_reg` `BPF_PSEUDO_KFUNC_CALL`, the
//! function's vmlinux BTF id as immediate) on a kernel that has the function, or into
//! `r0 = 0` on one that does not, where the programs never take that path (the `Config`
//! fields that select it stay 0) and the verifier drops it as dead code.

use node_diag_common::KFUNC_RDONLY_CAST_MARK;
use object::{Object, ObjectSection, SectionKind};

const BPF_JMP_CALL: u8 = 0x85;
const BPF_ALU64_MOV_K: u8 = 0xb7;
const BPF_PSEUDO_KFUNC_CALL: u8 = 2;
const INSN: usize = 8;

#[derive(Debug, thiserror::Error)]
pub enum KfuncError {
    #[error("the embedded eBPF object is not a readable ELF file: {0}")]
    Elf(#[from] object::Error),
    #[error("the eBPF object's code section `{0}` lies outside the file")]
    Section(String),
}

/// The object's bytes, aligned as aya's parser wants them (8 bytes: ELF64 headers are
/// read in place, and `include_bytes_aligned!` gave the embedded copy that alignment).
pub struct Object8 {
    words: Vec<u64>,
    len: usize,
}

impl Object8 {
    fn new(bytes: &[u8]) -> Self {
        let mut this = Self {
            words: vec![0; bytes.len().div_ceil(8)],
            len: bytes.len(),
        };
        this.bytes_mut().copy_from_slice(bytes);
        this
    }

    pub fn bytes(&self) -> &[u8] {
        // SAFETY: the words are initialised memory of at least `len` bytes (`len` ≤ 8 ×
        // their count), and any bit pattern is a valid `u8`.
        unsafe { std::slice::from_raw_parts(self.words.as_ptr().cast::<u8>(), self.len) }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`; the borrow of `self` is exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.words.as_mut_ptr().cast::<u8>(), self.len) }
    }
}

/// What [`resolve`] did: how many marked calls it rewrote, and into what.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resolved {
    pub calls: usize,
    /// The kfunc's BTF id the calls now name; `None`: rewritten into `r0 = 0`.
    pub rdonly_cast: Option<u32>,
}

/// Rewrites every marked call in `object`'s code sections (see the module overview).
/// `rdonly_cast`: the vmlinux BTF id of `bpf_rdonly_cast`, when this kernel has it.
pub fn resolve(object: &[u8], rdonly_cast: Option<u32>) -> Result<(Object8, Resolved), KfuncError> {
    let mut ranges = Vec::new();
    let file = object::File::parse(object)?;
    for section in file.sections() {
        if section.kind() != SectionKind::Text {
            continue;
        }
        let name = section.name().unwrap_or("?").to_owned();
        let (start, size) = section
            .file_range()
            .ok_or_else(|| KfuncError::Section(name.clone()))?;
        let end = start
            .checked_add(size)
            .filter(|end| *end <= object.len() as u64)
            .ok_or(KfuncError::Section(name))?;
        ranges.push(start as usize..end as usize);
    }
    let mut out = Object8::new(object);
    let bytes = out.bytes_mut();
    let mut calls = 0;
    for range in ranges {
        for insn in bytes[range].chunks_exact_mut(INSN) {
            if is_marked_call(insn) {
                rewrite(insn, rdonly_cast);
                calls += 1;
            }
        }
    }
    Ok((out, Resolved { calls, rdonly_cast }))
}

/// A `call` of the marker id: opcode, `src_reg` 0 (a helper call), immediate the mark.
/// Instructions are 8-byte aligned in a code section and the second half of a 16-byte
/// `ld_imm64` has opcode 0, so no other instruction's bytes can be taken for one.
fn is_marked_call(insn: &[u8]) -> bool {
    insn[0] == BPF_JMP_CALL
        && insn[1] >> 4 == 0
        && i32::from_le_bytes([insn[4], insn[5], insn[6], insn[7]]) == KFUNC_RDONLY_CAST_MARK
}

fn rewrite(insn: &mut [u8], kfunc: Option<u32>) {
    match kfunc {
        Some(id) => {
            // dst_reg 0, src_reg BPF_PSEUDO_KFUNC_CALL; offset 0: the function is in
            // vmlinux, not a module.
            insn[1] = BPF_PSEUDO_KFUNC_CALL << 4;
            insn[2..4].copy_from_slice(&0u16.to_le_bytes());
            insn[4..8].copy_from_slice(&id.to_le_bytes());
        }
        None => {
            insn[0] = BPF_ALU64_MOV_K;
            insn[1..8].fill(0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn insn(code: u8, regs: u8, imm: i32) -> [u8; 8] {
        let mut i = [0u8; 8];
        i[0] = code;
        i[1] = regs;
        i[4..8].copy_from_slice(&imm.to_le_bytes());
        i
    }

    #[test]
    fn a_marked_call_becomes_the_kfunc_call_or_a_zero_result() {
        let mut call = insn(BPF_JMP_CALL, 0, KFUNC_RDONLY_CAST_MARK);
        rewrite(&mut call, Some(65517));
        assert_eq!(call, insn(BPF_JMP_CALL, 0x20, 65517));
        let mut call = insn(BPF_JMP_CALL, 0, KFUNC_RDONLY_CAST_MARK);
        rewrite(&mut call, None);
        assert_eq!(call, insn(BPF_ALU64_MOV_K, 0, 0));
    }

    #[test]
    fn only_helper_calls_of_the_mark_are_marked() {
        assert!(is_marked_call(&insn(
            BPF_JMP_CALL,
            0,
            KFUNC_RDONLY_CAST_MARK
        )));
        // A real helper (bpf_probe_read_kernel), a BPF-to-BPF call, a constant load.
        assert!(!is_marked_call(&insn(BPF_JMP_CALL, 0, 113)));
        assert!(!is_marked_call(&insn(
            BPF_JMP_CALL,
            0x10,
            KFUNC_RDONLY_CAST_MARK
        )));
        assert!(!is_marked_call(&insn(
            BPF_ALU64_MOV_K,
            0,
            KFUNC_RDONLY_CAST_MARK
        )));
    }

    /// The agent's own object: the drop path's casts are there to rewrite, and nothing
    /// marked is left after.
    #[test]
    fn the_embedded_object_has_marked_calls_and_none_survive_resolving() {
        let object = super::super::loader::embedded_object();
        let (resolved, r) = resolve(object, Some(1)).unwrap();
        assert!(r.calls > 0, "no marked call in the object");
        // Every marked call in the file is in a code section (those start 8-byte
        // aligned), so each was found.
        let anywhere = object
            .chunks_exact(INSN)
            .filter(|i| is_marked_call(i))
            .count();
        assert_eq!(r.calls, anywhere);
        let (_, again) = resolve(resolved.bytes(), Some(1)).unwrap();
        assert_eq!(again.calls, 0);
        assert_eq!(resolved.bytes().len(), object.len());
    }
}
