//! tracefs access: mounting it when missing, tracepoint record layouts and the running
//! kernel's drop-reason names, all read from the `format` files rather than assumed.

use std::{
    collections::BTreeMap,
    fs,
    path::{Path, PathBuf},
};

use node_diag_common::DROP_REASON_SLOTS;

#[derive(Debug, thiserror::Error)]
pub(crate) enum TracefsError {
    #[error(
        "tracefs is not mounted and mounting it at {path} failed: {source} (mount it with `mount -t tracefs nodev {path}`, or run with CAP_SYS_ADMIN)"
    )]
    Mount {
        path: String,
        source: std::io::Error,
    },
    #[error("tracepoint {0} is not available on this kernel (no {1})")]
    MissingTracepoint(String, String),
    #[error("tracepoint {tracepoint} has no field `{field}` on this kernel")]
    MissingField { tracepoint: String, field: String },
    #[error(
        "field `{field}` of {tracepoint} sits at offset {offset}, beyond what node-diag supports"
    )]
    OffsetTooLarge {
        tracepoint: String,
        field: String,
        offset: usize,
    },
    #[error("reading {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
}

/// Where tracefs lives; `/sys/kernel/debug/tracing` is the pre-4.1 fallback.
const CANDIDATES: &[&str] = &["/sys/kernel/tracing", "/sys/kernel/debug/tracing"];

/// Returns the tracefs root, mounting it at `/sys/kernel/tracing` when no mount exists.
/// Returns whether this call mounted it, so the caller can report it.
pub(crate) fn ensure_mounted() -> Result<(PathBuf, bool), TracefsError> {
    if let Some(root) = find_mounted() {
        return Ok((root, false));
    }
    let path = CANDIDATES[0];
    mount_tracefs(path).map_err(|source| TracefsError::Mount {
        path: path.to_string(),
        source,
    })?;
    Ok((PathBuf::from(path), true))
}

/// The mounted tracefs root, if any.
pub(crate) fn find_mounted() -> Option<PathBuf> {
    CANDIDATES
        .iter()
        .map(PathBuf::from)
        .find(|p| p.join("events").is_dir())
}

fn mount_tracefs(path: &str) -> std::io::Result<()> {
    let src = c"nodev";
    let fstype = c"tracefs";
    let target = std::ffi::CString::new(path).map_err(std::io::Error::other)?;
    // SAFETY: all pointers are valid NUL-terminated strings; data is null.
    let rc = unsafe {
        libc::mount(
            src.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// One field of a tracepoint record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Field {
    pub(crate) offset: usize,
    pub(crate) size: usize,
}

/// The parsed `format` file of one tracepoint.
#[derive(Debug, Clone)]
pub(crate) struct Format {
    pub(crate) name: String,
    pub(crate) fields: BTreeMap<String, Field>,
    pub(crate) print_fmt: String,
}

impl Format {
    pub(crate) fn load(root: &Path, category: &str, name: &str) -> Result<Self, TracefsError> {
        let path = root.join("events").join(category).join(name).join("format");
        let text = fs::read_to_string(&path).map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                TracefsError::MissingTracepoint(
                    format!("{category}:{name}"),
                    path.display().to_string(),
                )
            } else {
                TracefsError::Io {
                    path: path.display().to_string(),
                    source: e,
                }
            }
        })?;
        Ok(Self::parse(&format!("{category}:{name}"), &text))
    }

    pub(crate) fn parse(name: &str, text: &str) -> Self {
        let mut fields = BTreeMap::new();
        let mut print_fmt = String::new();
        for line in text.lines() {
            let line = line.trim();
            if let Some(rest) = line.strip_prefix("print fmt:") {
                print_fmt = rest.trim().to_string();
                continue;
            }
            let Some(rest) = line.strip_prefix("field:") else {
                continue;
            };
            let mut decl = "";
            let mut offset = None;
            let mut size = None;
            for part in rest.split(';') {
                let part = part.trim();
                if let Some(v) = part.strip_prefix("offset:") {
                    offset = v.parse().ok();
                } else if let Some(v) = part.strip_prefix("size:") {
                    size = v.parse().ok();
                } else if decl.is_empty() {
                    decl = part;
                }
            }
            let ident = decl
                .rsplit(|c: char| c.is_whitespace() || c == '*')
                .next()
                .unwrap_or("");
            let ident = ident.split('[').next().unwrap_or("");
            if let (Some(offset), Some(size)) = (offset, size)
                && !ident.is_empty()
            {
                fields.insert(ident.to_string(), Field { offset, size });
            }
        }
        Self {
            name: name.to_string(),
            fields,
            print_fmt,
        }
    }

    pub(crate) fn field(&self, field: &str) -> Result<Field, TracefsError> {
        self.fields
            .get(field)
            .copied()
            .ok_or_else(|| TracefsError::MissingField {
                tracepoint: self.name.clone(),
                field: field.to_string(),
            })
    }

    /// The field's offset as the u16 the eBPF side reads it with.
    pub(crate) fn offset(&self, field: &str) -> Result<u16, TracefsError> {
        let f = self.field(field)?;
        u16::try_from(f.offset).map_err(|_| TracefsError::OffsetTooLarge {
            tracepoint: self.name.clone(),
            field: field.to_string(),
            offset: f.offset,
        })
    }

    /// `{ value, "NAME" }` pairs of the first `__print_symbolic` in the print format.
    pub(crate) fn symbols(&self) -> BTreeMap<u32, String> {
        let mut out = BTreeMap::new();
        let Some(start) = self.print_fmt.find("__print_symbolic(") else {
            return out;
        };
        let mut rest = &self.print_fmt[start..];
        while let Some(open) = rest.find('{') {
            let Some(close) = rest[open..].find('}') else {
                break;
            };
            let entry = &rest[open + 1..open + close];
            if let Some((num, name)) = entry.split_once(',') {
                let num = num.trim();
                let parsed = num
                    .strip_prefix("0x")
                    .map_or_else(|| num.parse().ok(), |h| u32::from_str_radix(h, 16).ok());
                let name = name.trim().trim_matches('"');
                if let Some(v) = parsed {
                    out.insert(v, name.to_string());
                }
            }
            rest = &rest[open + close + 1..];
        }
        out
    }
}

/// The running kernel's `enum skb_drop_reason` names, by value.
#[derive(Debug, Clone, Default)]
pub(crate) struct DropReasons(BTreeMap<u32, String>);

impl DropReasons {
    pub(crate) fn from_format(kfree_skb: &Format) -> Self {
        Self(kfree_skb.symbols())
    }

    /// The agent's own table, where the kernel has none (see [`super::drop_sites`]).
    pub(crate) fn from_table(table: BTreeMap<u32, String>) -> Self {
        Self(table)
    }

    pub(crate) fn name(&self, value: u32) -> String {
        self.0
            .get(&value)
            .cloned()
            .unwrap_or_else(|| format!("REASON_{value}"))
    }

    pub(crate) fn value(&self, name: &str) -> Option<u32> {
        self.0.iter().find(|(_, n)| *n == name).map(|(v, _)| *v)
    }

    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }

    /// How many slots of the drop-reason array this kernel's reasons can fill: one past
    /// the largest reason it lists (66 on 6.1, about 130 on 6.18), at most
    /// [`DROP_REASON_SLOTS`]; every slot when it lists none. The agent reads no more.
    pub(crate) fn slots(&self) -> u32 {
        self.0.keys().next_back().map_or(DROP_REASON_SLOTS, |&max| {
            max.saturating_add(1).min(DROP_REASON_SLOTS)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KFREE: &str = r#"name: kfree_skb
ID: 1720
format:
	field:unsigned short common_type;	offset:0;	size:2;	signed:0;
	field:void * skbaddr;	offset:8;	size:8;	signed:0;
	field:unsigned short protocol;	offset:32;	size:2;	signed:0;
	field:enum skb_drop_reason reason;	offset:36;	size:4;	signed:0;
	field:__u8 saddr[4];	offset:40;	size:4;	signed:0;

print fmt: "skbaddr=%p reason: %s", REC->skbaddr, __print_symbolic(REC->reason, { 2, "NOT_SPECIFIED" }, { 12, "NETFILTER_DROP" }, { 0x5d, "PKT_TOO_BIG" })
"#;

    #[test]
    fn parses_fields_and_arrays() {
        let f = Format::parse("skb:kfree_skb", KFREE);
        assert_eq!(f.field("skbaddr").unwrap(), Field { offset: 8, size: 8 });
        assert_eq!(f.offset("reason").unwrap(), 36);
        assert_eq!(
            f.field("saddr").unwrap(),
            Field {
                offset: 40,
                size: 4
            }
        );
        assert!(matches!(
            f.field("nope"),
            Err(TracefsError::MissingField { .. })
        ));
    }

    #[test]
    fn parses_drop_reason_names() {
        let r = DropReasons::from_format(&Format::parse("skb:kfree_skb", KFREE));
        assert_eq!(r.name(12), "NETFILTER_DROP");
        assert_eq!(r.value("PKT_TOO_BIG"), Some(93));
        assert_eq!(r.name(7), "REASON_7");
        assert_eq!(r.len(), 3);
        // Reads stop past PKT_TOO_BIG (0x5d); with no names known, every slot is read.
        assert_eq!(r.slots(), 94);
        assert_eq!(DropReasons::default().slots(), DROP_REASON_SLOTS);
    }
}
