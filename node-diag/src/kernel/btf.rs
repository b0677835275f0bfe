//! A minimal reader of the kernel's BTF (`/sys/kernel/btf/vmlinux`): just enough to find
//! struct member offsets, walking through anonymous structs and unions, so the eBPF
//! programs read `struct sk_buff`/`sock`/`net_device` fields at this kernel's offsets;
//! and the argument types of a raw tracepoint (its `btf_trace_<name>` prototype), so the
//! agent attaches a raw tracepoint program only where its arguments are where it reads
//! them; and the ids of the few kernel functions (kfuncs) and structs the programs call
//! and cast to.

use std::collections::HashMap;

pub(crate) const VMLINUX: &str = "/sys/kernel/btf/vmlinux";

#[derive(Debug, thiserror::Error)]
pub(crate) enum BtfError {
    #[error("reading {path}: {source} (the kernel needs CONFIG_DEBUG_INFO_BTF=y)")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("malformed BTF: {0}")]
    Malformed(&'static str),
    #[error("BTF has no struct `{0}`")]
    NoStruct(String),
    #[error("BTF struct `{0}` has no member `{1}`")]
    NoMember(String, String),
    #[error("BTF has no prototype for raw tracepoint `{0}` (no btf_trace_{0})")]
    NoTracepoint(String),
}

const KIND_INT: u32 = 1;
const KIND_PTR: u32 = 2;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_ENUM: u32 = 6;
const KIND_TYPEDEF: u32 = 8;
const KIND_FUNC: u32 = 12;
const KIND_FUNC_PROTO: u32 = 13;
const KIND_ENUM64: u32 = 19;
/// The kernel functions whose BTF ids are kept (vmlinux has tens of thousands): the
/// kfunc the programs call, and the functions fentry fallbacks attach to (see
/// [`super::hooks::Fallback`]).
pub(crate) const KFUNCS: &[&str] = &[
    "bpf_rdonly_cast",
    "sock_def_error_report",
    "__icmp_send",
    "icmp6_send",
    "tcf_classify",
    "tcf_classify_ingress",
    "__cgroup_bpf_run_filter_skb",
];
/// Raw tracepoints' prototypes are typedefs named so.
const TRACE_PREFIX: &str = "btf_trace_";

#[derive(Debug, Clone)]
struct Member {
    name: String,
    type_id: u32,
    bit_offset: u32,
}

#[derive(Debug, Clone)]
struct Type {
    kind: u32,
    /// For typedef/const/volatile/... the referenced type.
    referenced: u32,
    /// Struct/union members, or a function prototype's parameters (unnamed).
    members: Vec<Member>,
    /// Kept for the kinds an argument is named by (ints, structs, unions, enums).
    name: String,
}

/// Parsed type table of one BTF blob.
pub(crate) struct Btf {
    types: Vec<Type>,
    structs_by_name: HashMap<String, u32>,
    /// Raw tracepoint name -> its `btf_trace_<name>` typedef.
    tracepoints: HashMap<String, u32>,
    /// [`KFUNCS`] this kernel has -> their `FUNC` ids.
    funcs: HashMap<String, u32>,
}

impl Btf {
    pub(crate) fn from_sys_fs() -> Result<Self, BtfError> {
        let data = std::fs::read(VMLINUX).map_err(|source| BtfError::Read {
            path: VMLINUX.to_string(),
            source,
        })?;
        Self::parse(&data)
    }

    pub(crate) fn parse(data: &[u8]) -> Result<Self, BtfError> {
        let rd = |off: usize| -> Result<u32, BtfError> {
            data.get(off..off + 4)
                .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .ok_or(BtfError::Malformed("truncated"))
        };
        if data.len() < 24 || data[0..2] != [0x9f, 0xeb] {
            return Err(BtfError::Malformed(
                "bad magic (only little-endian BTF is read)",
            ));
        }
        let hdr_len = rd(4)? as usize;
        let type_off = rd(8)? as usize;
        let type_len = rd(12)? as usize;
        let str_off = rd(16)? as usize;
        let str_len = rd(20)? as usize;
        let types_start = hdr_len + type_off;
        let types_end = types_start + type_len;
        let strs = data
            .get(hdr_len + str_off..hdr_len + str_off + str_len)
            .ok_or(BtfError::Malformed("string section out of bounds"))?;
        let name_at = |off: u32| -> String {
            let off = off as usize;
            strs.get(off..)
                .and_then(|s| s.split(|b| *b == 0).next())
                .map(|s| String::from_utf8_lossy(s).into_owned())
                .unwrap_or_default()
        };

        // Type id 0 is `void`.
        let mut types = vec![Type {
            kind: 0,
            referenced: 0,
            members: Vec::new(),
            name: "void".to_owned(),
        }];
        let mut structs_by_name = HashMap::new();
        let mut tracepoints = HashMap::new();
        let mut funcs = HashMap::new();
        let mut pos = types_start;
        while pos < types_end {
            let name_off = rd(pos)?;
            let info = rd(pos + 4)?;
            let size_or_type = rd(pos + 8)?;
            pos += 12;
            let vlen = (info & 0xffff) as usize;
            let kind = (info >> 24) & 0x1f;
            let kind_flag = info >> 31 == 1;
            let mut members = Vec::new();
            let extra = match kind {
                1 | 14 | 17 => 4, // int, var, decl_tag
                3 => 12,          // array
                4 | 5 => {
                    for i in 0..vlen {
                        let m = pos + i * 12;
                        let raw_off = rd(m + 8)?;
                        members.push(Member {
                            name: name_at(rd(m)?),
                            type_id: rd(m + 4)?,
                            bit_offset: if kind_flag {
                                raw_off & 0xff_ffff
                            } else {
                                raw_off
                            },
                        });
                    }
                    vlen * 12
                }
                13 => {
                    for i in 0..vlen {
                        members.push(Member {
                            name: String::new(),
                            type_id: rd(pos + i * 8 + 4)?,
                            bit_offset: 0,
                        });
                    }
                    vlen * 8
                }
                6 => vlen * 8,        // enum
                15 | 19 => vlen * 12, // datasec, enum64
                _ => 0,               // ptr, fwd, typedef, modifiers, func, float, type_tag
            };
            pos += extra;
            let name = name_at(name_off);
            let id = types.len() as u32;
            if kind == KIND_STRUCT && !name.is_empty() && !members.is_empty() {
                structs_by_name.entry(name.clone()).or_insert(id);
            }
            if kind == KIND_TYPEDEF
                && let Some(tracepoint) = name.strip_prefix(TRACE_PREFIX)
            {
                tracepoints.insert(tracepoint.to_owned(), id);
            }
            if kind == KIND_FUNC && KFUNCS.contains(&name.as_str()) {
                funcs.entry(name.clone()).or_insert(id);
            }
            let named = matches!(
                kind,
                KIND_INT | KIND_STRUCT | KIND_UNION | KIND_ENUM | KIND_ENUM64
            );
            types.push(Type {
                kind,
                referenced: size_or_type,
                members,
                name: if named { name } else { String::new() },
            });
        }
        Ok(Self {
            types,
            structs_by_name,
            tracepoints,
            funcs,
        })
    }

    /// Byte offset of `member` in `struct name`, searching anonymous members too.
    pub(crate) fn member_offset(&self, name: &str, member: &str) -> Result<u32, BtfError> {
        self.path_offset(name, member)
    }

    /// Offset of a dotted path such as `__sk_common.skc_net.net` from `struct name`.
    pub(crate) fn path_offset(&self, name: &str, path: &str) -> Result<u32, BtfError> {
        let mut id = *self
            .structs_by_name
            .get(name)
            .ok_or_else(|| BtfError::NoStruct(name.to_string()))?;
        let mut bits = 0;
        for part in path.split('.') {
            let (off, ty) = self
                .find(id, part, 0)
                .ok_or_else(|| BtfError::NoMember(name.to_string(), path.to_string()))?;
            bits += off;
            id = self.resolve(ty);
        }
        Ok(bits / 8)
    }

    /// BTF id of `struct name`.
    pub(crate) fn struct_id(&self, name: &str) -> Result<u32, BtfError> {
        self.structs_by_name
            .get(name)
            .copied()
            .ok_or_else(|| BtfError::NoStruct(name.to_string()))
    }

    /// BTF id of kernel function `name` (one of [`KFUNCS`]), when this kernel has it.
    pub(crate) fn func_id(&self, name: &str) -> Option<u32> {
        self.funcs.get(name).copied()
    }

    /// How many arguments kernel function `name` (one of [`KFUNCS`]) takes here.
    pub(crate) fn func_arg_count(&self, name: &str) -> Option<usize> {
        let func = self.types.get(*self.funcs.get(name)? as usize)?;
        let proto = self.types.get(self.resolve(func.referenced) as usize)?;
        (proto.kind == KIND_FUNC_PROTO).then_some(proto.members.len())
    }

    /// Size in bytes of `struct name`.
    pub(crate) fn struct_size(&self, name: &str) -> Result<u32, BtfError> {
        let id = *self
            .structs_by_name
            .get(name)
            .ok_or_else(|| BtfError::NoStruct(name.to_string()))?;
        // A struct's size/type word is its size.
        Ok(self.types[id as usize].referenced)
    }

    /// The argument types of raw tracepoint `name`, as the program sees them in its
    /// context (the prototype's leading `void *` data pointer left out): `*sock` for a
    /// pointer to `struct sock`, `*void`, `int`, `skb_drop_reason` (an enum)...
    pub(crate) fn trace_args(&self, name: &str) -> Result<Vec<String>, BtfError> {
        let typedef = *self
            .tracepoints
            .get(name)
            .ok_or_else(|| BtfError::NoTracepoint(name.to_owned()))?;
        let ptr = self.resolve(typedef);
        let proto = self
            .types
            .get(ptr as usize)
            .filter(|t| t.kind == KIND_PTR)
            .map(|t| self.resolve(t.referenced))
            .and_then(|id| self.types.get(id as usize))
            .filter(|t| t.kind == KIND_FUNC_PROTO)
            .ok_or(BtfError::Malformed(
                "btf_trace_ typedef is not a function pointer",
            ))?;
        Ok(proto
            .members
            .iter()
            .skip(1)
            .map(|m| self.type_name(m.type_id))
            .collect())
    }

    fn type_name(&self, id: u32) -> String {
        let id = self.resolve(id);
        match self.types.get(id as usize) {
            Some(t) if t.kind == KIND_PTR => format!("*{}", self.type_name(t.referenced)),
            Some(t) => t.name.clone(),
            None => String::new(),
        }
    }

    fn resolve(&self, mut id: u32) -> u32 {
        // typedef(8), volatile(9), const(10), restrict(11), type_tag(18)
        while let Some(t) = self.types.get(id as usize) {
            if matches!(t.kind, 8..=11 | 18) {
                id = t.referenced;
            } else {
                break;
            }
        }
        id
    }

    /// `(bit offset, type id)` of `member` in type `id`, through anonymous members.
    fn find(&self, id: u32, member: &str, base: u32) -> Option<(u32, u32)> {
        let ty = self.types.get(id as usize)?;
        if let Some(m) = ty.members.iter().find(|m| m.name == member) {
            return Some((base + m.bit_offset, m.type_id));
        }
        ty.members
            .iter()
            .filter(|m| m.name.is_empty())
            .find_map(|m| {
                let inner = self.resolve(m.type_id);
                let kind = self.types.get(inner as usize)?.kind;
                if kind == KIND_STRUCT || kind == KIND_UNION {
                    self.find(inner, member, base + m.bit_offset)
                } else {
                    None
                }
            })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Builds a BTF blob: `struct inner { int a; int b; }`,
    /// `struct outer { long x; union { int y; struct inner in; }; }`, a raw
    /// tracepoint `demo(const struct outer *, int)`, and functions `bpf_rdonly_cast` and
    /// `other_fn`.
    pub(crate) fn blob() -> Vec<u8> {
        let strings =
            b"\0int\0a\0b\0inner\0outer\0x\0y\0in\0btf_trace_demo\0bpf_rdonly_cast\0other_fn\0";
        let s = |name: &str| -> u32 {
            let needle = format!("\0{name}\0");
            strings
                .windows(needle.len())
                .position(|w| w == needle.as_bytes())
                .unwrap() as u32
                + 1
        };
        let mut t = Vec::new();
        let mut push = |v: u32| t.extend_from_slice(&v.to_le_bytes());
        // 1: int
        push(s("int"));
        push(1 << 24);
        push(4);
        push(32);
        // 2: struct inner { a@0, b@32 }
        push(s("inner"));
        push((4 << 24) | 2);
        push(8);
        push(s("a"));
        push(1);
        push(0);
        push(s("b"));
        push(1);
        push(32);
        // 3: anonymous union { y: int @0, in: inner @0 }
        push(0);
        push((5 << 24) | 2);
        push(8);
        push(s("y"));
        push(1);
        push(0);
        push(s("in"));
        push(2);
        push(0);
        // 4: struct outer { x@0, <anon union>@64 }
        push(s("outer"));
        push((4 << 24) | 2);
        push(16);
        push(s("x"));
        push(1);
        push(0);
        push(0);
        push(3);
        push(64);
        // 5: void *; 6: const struct outer *; 7: the const
        push(0);
        push(2 << 24);
        push(0);
        push(0);
        push(2 << 24);
        push(7);
        push(0);
        push(10 << 24);
        push(4);
        // 8: void (void *, const struct outer *, int); 9: pointer to it
        push(0);
        push((13 << 24) | 3);
        push(0);
        for param in [5, 6, 1] {
            push(0);
            push(param);
        }
        push(0);
        push(2 << 24);
        push(8);
        // 10: typedef btf_trace_demo, as the kernel declares each raw tracepoint
        push(s("btf_trace_demo"));
        push(8 << 24);
        push(9);
        // 11, 12: two functions of prototype 8, one of them a kfunc the agent calls
        push(s("bpf_rdonly_cast"));
        push(12 << 24);
        push(8);
        push(s("other_fn"));
        push(12 << 24);
        push(8);
        let mut out = vec![0x9f, 0xeb, 1, 0];
        out.extend_from_slice(&24u32.to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        out.extend_from_slice(&(t.len() as u32).to_le_bytes());
        out.extend_from_slice(&(t.len() as u32).to_le_bytes());
        out.extend_from_slice(&(strings.len() as u32).to_le_bytes());
        out.extend_from_slice(&t);
        out.extend_from_slice(strings);
        out
    }

    #[test]
    fn finds_members_through_anonymous_unions() {
        let btf = Btf::parse(&blob()).unwrap();
        assert_eq!(btf.member_offset("outer", "x").unwrap(), 0);
        assert_eq!(btf.member_offset("outer", "y").unwrap(), 8);
        assert_eq!(btf.struct_size("outer").unwrap(), 16);
        assert_eq!(btf.path_offset("outer", "in.b").unwrap(), 12);
        assert!(matches!(
            btf.member_offset("outer", "zz"),
            Err(BtfError::NoMember(..))
        ));
        assert!(matches!(
            btf.member_offset("nope", "x"),
            Err(BtfError::NoStruct(_))
        ));
    }

    #[test]
    fn names_a_raw_tracepoints_arguments() {
        let btf = Btf::parse(&blob()).unwrap();
        assert_eq!(btf.trace_args("demo").unwrap(), ["*outer", "int"]);
        assert!(matches!(
            btf.trace_args("nope"),
            Err(BtfError::NoTracepoint(_))
        ));
    }

    #[test]
    fn keeps_the_ids_of_the_kfuncs_it_calls_and_of_structs() {
        let btf = Btf::parse(&blob()).unwrap();
        assert_eq!(btf.func_id("bpf_rdonly_cast"), Some(11));
        assert_eq!(btf.func_arg_count("bpf_rdonly_cast"), Some(3));
        assert_eq!(btf.func_arg_count("other_fn"), None);
        // Not one of KFUNCS: vmlinux's tens of thousands of functions are not kept.
        assert_eq!(btf.func_id("other_fn"), None);
        assert_eq!(btf.struct_id("outer").unwrap(), 4);
        assert!(matches!(btf.struct_id("nope"), Err(BtfError::NoStruct(_))));
    }

    #[test]
    fn rejects_garbage() {
        assert!(Btf::parse(b"not btf at all, definitely not").is_err());
    }

    #[test]
    fn reads_this_kernels_sk_buff_when_present() {
        let Ok(btf) = Btf::from_sys_fs() else {
            return; // no BTF on this build host: covered by the synthetic blob above
        };
        let head = btf.member_offset("sk_buff", "head").unwrap();
        let nh = btf.member_offset("sk_buff", "network_header").unwrap();
        assert!(head > 0 && nh > 0 && head != nh);
        let args = btf.trace_args("kfree_skb").unwrap();
        assert_eq!(args[..3], ["*sk_buff", "*void", "skb_drop_reason"]);
    }
}
