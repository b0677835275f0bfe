//! Whole-map reads in a few syscalls (`BPF_MAP_LOOKUP_BATCH`, Linux 5.6+) instead of
//! two per entry (next key, lookup): a tick that reads 16,384 aggregated verdict keys
//! costs a handful of syscalls, not 32,768.

use std::io;
use std::mem::size_of;
use std::os::fd::{AsRawFd, BorrowedFd};

use aya::Pod;

const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;
/// Entries asked for per call. A hash map answers a whole bucket or nothing, so this
/// must exceed the longest bucket (`ENOSPC` otherwise): far beyond what a hash with
/// the map's size in buckets holds.
const CHUNK: usize = 1024;

/// The `BPF_MAP_*_BATCH` commands' part of `union bpf_attr`.
#[repr(C)]
struct BatchAttr {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}

/// Every entry of the hash map `fd` (keys `K`, values `V`), read in batches. An error
/// (a kernel without batch lookups, `EINVAL`/`ENOTSUPP`) leaves the caller its
/// entry-by-entry read.
pub(crate) fn lookup_all<K: Pod, V: Pod>(fd: BorrowedFd<'_>) -> io::Result<Vec<(K, V)>> {
    let mut out = Vec::new();
    // The hash map's batch token is a bucket index (u32); room for more costs nothing.
    let (mut token_in, mut token_out) = (0u64, 0u64);
    let mut first = true;
    let mut keys: Vec<K> = Vec::with_capacity(CHUNK);
    let mut values: Vec<V> = Vec::with_capacity(CHUNK);
    loop {
        let mut attr = BatchAttr {
            in_batch: if first {
                0
            } else {
                (&raw const token_in) as u64
            },
            out_batch: (&raw mut token_out) as u64,
            keys: keys.as_mut_ptr() as u64,
            values: values.as_mut_ptr() as u64,
            count: CHUNK as u32,
            map_fd: fd.as_raw_fd() as u32,
            elem_flags: 0,
            flags: 0,
        };
        // SAFETY: `attr` is a valid bpf_attr prefix for this command; the key and value
        // buffers hold CHUNK elements of the map's key and value sizes (Pod: any bytes
        // are a value), and the tokens 8 bytes; all outlive the call.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_MAP_LOOKUP_BATCH,
                &raw mut attr,
                size_of::<BatchAttr>() as libc::c_uint,
            )
        };
        let err = (rc != 0).then(io::Error::last_os_error);
        let done = match &err {
            None => false,
            Some(e) if e.raw_os_error() == Some(libc::ENOENT) => true,
            Some(_) => return Err(err.unwrap_or_else(|| io::Error::other("batch lookup"))),
        };
        let n = (attr.count as usize).min(CHUNK);
        // SAFETY: the kernel filled the first `n` elements of each buffer.
        unsafe {
            keys.set_len(n);
            values.set_len(n);
        }
        out.extend(keys.drain(..).zip(values.drain(..)));
        if done {
            return Ok(out);
        }
        token_in = token_out;
        first = false;
    }
}
