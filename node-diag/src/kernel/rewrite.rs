//! Marked calls in the eBPF object, rewritten before aya parses it. aya's loader
//! relocates helper and BPF-to-BPF calls but not kfunc calls, and has no way to make a
//! load-time setting an instruction's immediate, so the programs call helper ids no
//! kernel has and [`resolve`] rewrites each such call in the object's code:
//! - [`KFUNC_RDONLY_CAST_MARK`]: into a kfunc call (`src_reg` `BPF_PSEUDO_KFUNC_CALL`, the
//!   function's vmlinux BTF id as immediate) on a kernel that has the function, or into
//!   `r0 = 0` on one that does not, where the programs never take that path (the `Config`
//!   fields that select it stay 0) and the verifier drops it as dead code;
//! - [`IMM_MARK`] `+ n`: into `w0 = value`, the value of setting `n` of
//!   [`imm`](node_diag_common::imm) in this kernel's `Config`.

use node_diag_common::{IMM_MARK, KFUNC_RDONLY_CAST_MARK, imm};
use object::{Object, ObjectSection, SectionKind};

const BPF_JMP_CALL: u8 = 0x85;
const BPF_ALU64_MOV_K: u8 = 0xb7;
const BPF_ALU_MOV_K: u8 = 0xb4;
/// How many helper ids from [`IMM_MARK`] on are taken as marks, known settings or not:
/// a mark of a setting without a value fails the load here, with its number, rather than
/// in the verifier as an unknown helper.
const IMM_MARKS: i32 = 0x100;
const BPF_PSEUDO_KFUNC_CALL: u8 = 2;
const INSN: usize = 8;

#[derive(Debug, thiserror::Error)]
pub(crate) enum RewriteError {
    #[error("the embedded eBPF object is not a readable ELF file: {0}")]
    Elf(#[from] object::Error),
    #[error("the eBPF object's code section `{0}` lies outside the file")]
    Section(String),
    #[error(
        "the eBPF object asks for load-time setting {0} as an immediate, which `Config::immediates` does not give (a number of `imm` without a value)"
    )]
    UnknownImmediate(usize),
}

/// The object's bytes, aligned as aya's parser wants them (8 bytes: ELF64 headers are
/// read in place, and `include_bytes_aligned!` gave the embedded copy that alignment).
pub(crate) struct Object8 {
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

    pub(crate) fn bytes(&self) -> &[u8] {
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
pub(crate) struct Resolved {
    /// Calls of the kfunc's mark.
    pub(crate) calls: usize,
    /// The kfunc's BTF id the calls now name; `None`: rewritten into `r0 = 0`.
    pub(crate) rdonly_cast: Option<u32>,
    /// Calls of an immediate's mark, per setting.
    pub(crate) immediates: [usize; imm::COUNT],
}

/// Rewrites every marked call in `object`'s code sections (see the module overview).
/// `rdonly_cast`: the vmlinux BTF id of `bpf_rdonly_cast`, when this kernel has it;
/// `immediates`: the settings' values (`Config::immediates`).
pub(crate) fn resolve(
    object: &[u8],
    rdonly_cast: Option<u32>,
    immediates: [u32; imm::COUNT],
) -> Result<(Object8, Resolved), RewriteError> {
    let mut ranges = Vec::new();
    let file = object::File::parse(object)?;
    for section in file.sections() {
        if section.kind() != SectionKind::Text {
            continue;
        }
        let name = section.name().unwrap_or("?").to_owned();
        let (start, size) = section
            .file_range()
            .ok_or_else(|| RewriteError::Section(name.clone()))?;
        let end = start
            .checked_add(size)
            .filter(|end| *end <= object.len() as u64)
            .ok_or(RewriteError::Section(name))?;
        ranges.push(start as usize..end as usize);
    }
    let mut out = Object8::new(object);
    let bytes = out.bytes_mut();
    let mut resolved = Resolved {
        calls: 0,
        rdonly_cast,
        immediates: [0; imm::COUNT],
    };
    for range in ranges {
        for insn in bytes[range].chunks_exact_mut(INSN) {
            match mark(insn) {
                Some(Mark::Kfunc) => {
                    rewrite_kfunc(insn, rdonly_cast);
                    resolved.calls += 1;
                }
                Some(Mark::Immediate(n)) => {
                    let value = *immediates.get(n).ok_or(RewriteError::UnknownImmediate(n))?;
                    rewrite_immediate(insn, value);
                    resolved.immediates[n] += 1;
                }
                None => {}
            }
        }
    }
    Ok((out, resolved))
}

#[derive(Debug, PartialEq, Eq)]
enum Mark {
    Kfunc,
    /// The setting's number (the id's offset from [`IMM_MARK`]).
    Immediate(usize),
}

/// A `call` of a marker id: opcode, `src_reg` 0 (a helper call), immediate a mark.
/// Instructions are 8-byte aligned in a code section and the second half of a 16-byte
/// `ld_imm64` has opcode 0, so no other instruction's bytes can be taken for one.
fn mark(insn: &[u8]) -> Option<Mark> {
    if insn[0] != BPF_JMP_CALL || insn[1] >> 4 != 0 {
        return None;
    }
    let id = i32::from_le_bytes([insn[4], insn[5], insn[6], insn[7]]);
    if id == KFUNC_RDONLY_CAST_MARK {
        Some(Mark::Kfunc)
    } else if (IMM_MARK..IMM_MARK + IMM_MARKS).contains(&id) {
        // In the range, so not negative.
        Some(Mark::Immediate((id - IMM_MARK) as usize))
    } else {
        None
    }
}

fn rewrite_kfunc(insn: &mut [u8], kfunc: Option<u32>) {
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

/// `w0 = value`: the 32-bit move zero-extends, so r0 holds `value` whole (an `r0 =`
/// would sign-extend values from 2^31 on).
fn rewrite_immediate(insn: &mut [u8], value: u32) {
    insn[0] = BPF_ALU_MOV_K;
    insn[1..4].fill(0);
    insn[4..8].copy_from_slice(&value.to_le_bytes());
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
        rewrite_kfunc(&mut call, Some(65517));
        assert_eq!(call, insn(BPF_JMP_CALL, 0x20, 65517));
        let mut call = insn(BPF_JMP_CALL, 0, KFUNC_RDONLY_CAST_MARK);
        rewrite_kfunc(&mut call, None);
        assert_eq!(call, insn(BPF_ALU64_MOV_K, 0, 0));
    }

    #[test]
    fn an_immediate_mark_becomes_a_zero_extending_move_of_the_value() {
        let mut call = insn(BPF_JMP_CALL, 0, IMM_MARK + imm::TCP_RTO_COUNT);
        rewrite_immediate(&mut call, 1249);
        assert_eq!(call, insn(BPF_ALU_MOV_K, 0, 1249));
        // A BTF id past 2^31 stays that id (r0 = would make it negative).
        let mut call = insn(BPF_JMP_CALL, 0, IMM_MARK + imm::CAST_TCP_SOCK);
        rewrite_immediate(&mut call, 0x8000_0001);
        assert_eq!(call, insn(BPF_ALU_MOV_K, 0, 0x8000_0001_u32 as i32));
    }

    #[test]
    fn only_helper_calls_of_a_mark_are_marked() {
        assert_eq!(
            mark(&insn(BPF_JMP_CALL, 0, KFUNC_RDONLY_CAST_MARK)),
            Some(Mark::Kfunc)
        );
        assert_eq!(
            mark(&insn(BPF_JMP_CALL, 0, IMM_MARK + 3)),
            Some(Mark::Immediate(3))
        );
        // A real helper (bpf_probe_read_kernel), a BPF-to-BPF call, a constant load, an id
        // just past the immediates' range.
        assert_eq!(mark(&insn(BPF_JMP_CALL, 0, 113)), None);
        assert_eq!(
            mark(&insn(BPF_JMP_CALL, 0x10, KFUNC_RDONLY_CAST_MARK)),
            None
        );
        assert_eq!(mark(&insn(BPF_JMP_CALL, 0x10, IMM_MARK)), None);
        assert_eq!(
            mark(&insn(BPF_ALU64_MOV_K, 0, KFUNC_RDONLY_CAST_MARK)),
            None
        );
        assert_eq!(mark(&insn(BPF_JMP_CALL, 0, IMM_MARK + IMM_MARKS)), None);
    }

    /// The agent's own object: the drop path's casts and the retransmit hook's
    /// immediates are there to rewrite, and nothing marked is left after.
    #[test]
    fn the_embedded_object_has_marked_calls_and_none_survive_resolving() {
        let object = super::super::loader::embedded_object();
        let values = [18, 1, 1249, 36710];
        let (resolved, r) = resolve(object, Some(1), values).unwrap();
        assert!(r.calls > 0, "no marked kfunc call in the object");
        assert!(
            r.immediates.iter().all(|&n| n > 0),
            "a setting of `imm` that no program takes as an immediate: {:?}",
            r.immediates
        );
        // Every marked call in the file is in a code section (those start 8-byte
        // aligned), so each was found.
        let anywhere = object
            .chunks_exact(INSN)
            .filter(|i| mark(i).is_some())
            .count();
        assert_eq!(r.calls + r.immediates.iter().sum::<usize>(), anywhere);
        let (_, again) = resolve(resolved.bytes(), Some(1), values).unwrap();
        assert_eq!(again.calls + again.immediates.iter().sum::<usize>(), 0);
        assert_eq!(resolved.bytes().len(), object.len());
    }
}
