//! Whole-map reads in a few syscalls (`BPF_MAP_LOOKUP_BATCH`, Linux 5.6+) instead of
//! two per entry (next key, lookup): a tick that reads 16,384 aggregated verdict keys
//! costs a handful of syscalls, not 32,768; a per-CPU array of counters one, not one per
//! slot.

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
    lookup_raw(fd, size_of::<K>(), size_of::<V>(), usize::MAX, |k, v| {
        out.push((read::<K>(k), read::<V>(v)));
    })?;
    Ok(out)
}

/// The first `max` entries (at most) of the per-CPU map `fd` (an array or a hash; keys
/// `K`, values `V` on each of `cpus` possible CPUs), each with its values summed by
/// `sum`, read in batches: a per-CPU array of counters costs one syscall a tick, not one
/// per slot. Errors as [`lookup_all`] (per-CPU arrays take batch lookups from 5.6);
/// also `InvalidInput` for a value whose size is not a multiple of 8 (the kernel pads
/// each CPU's copy to 8 bytes; none of ours needs it).
pub(crate) fn lookup_percpu<K: Pod, V: Pod, S>(
    fd: BorrowedFd<'_>,
    cpus: usize,
    max: usize,
    mut sum: impl FnMut(&[V]) -> S,
) -> io::Result<Vec<(K, S)>> {
    if !size_of::<V>().is_multiple_of(8) || size_of::<V>() == 0 || cpus == 0 {
        return Err(io::Error::from(io::ErrorKind::InvalidInput));
    }
    let mut out = Vec::new();
    let mut values: Vec<V> = Vec::with_capacity(cpus);
    lookup_raw(fd, size_of::<K>(), size_of::<V>() * cpus, max, |k, v| {
        values.clear();
        values.extend(v.chunks_exact(size_of::<V>()).map(read::<V>));
        out.push((read::<K>(k), sum(&values)));
    })?;
    Ok(out)
}

/// A `T` from the first `size_of::<T>()` bytes of `bytes`.
fn read<T: Pod>(bytes: &[u8]) -> T {
    debug_assert!(bytes.len() >= size_of::<T>());
    // SAFETY: `bytes` holds at least `size_of::<T>()` bytes (the caller's key or value
    // slot), `T: Pod` makes any bytes a value, and the read is unaligned.
    unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<T>()) }
}

/// Reads up to `max` entries of map `fd` in batches of [`CHUNK`], handing each key's and
/// value's bytes to `each`.
fn lookup_raw(
    fd: BorrowedFd<'_>,
    key_size: usize,
    value_size: usize,
    max: usize,
    mut each: impl FnMut(&[u8], &[u8]),
) -> io::Result<()> {
    // The hash map's batch token is a bucket index (u32), an array's a key (u32); room
    // for more costs nothing.
    let (mut token_in, mut token_out) = (0u64, 0u64);
    let mut first = true;
    let mut keys = vec![0u8; CHUNK * key_size];
    let mut values = vec![0u8; CHUNK * value_size];
    let mut seen = 0usize;
    loop {
        let want = CHUNK.min(max - seen);
        if want == 0 {
            return Ok(());
        }
        let mut attr = BatchAttr {
            in_batch: if first {
                0
            } else {
                (&raw const token_in) as u64
            },
            out_batch: (&raw mut token_out) as u64,
            keys: keys.as_mut_ptr() as u64,
            values: values.as_mut_ptr() as u64,
            count: want as u32,
            map_fd: fd.as_raw_fd() as u32,
            elem_flags: 0,
            flags: 0,
        };
        // SAFETY: `attr` is a valid bpf_attr prefix for this command; the key and value
        // buffers hold CHUNK elements of the map's key and value sizes (the caller's),
        // `want` <= CHUNK, and the tokens 8 bytes; all outlive the call.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_MAP_LOOKUP_BATCH,
                &raw mut attr,
                size_of::<BatchAttr>() as libc::c_uint,
            )
        };
        let err = (rc != 0).then(io::Error::last_os_error);
        let done = match err {
            None => false,
            Some(e) if e.raw_os_error() == Some(libc::ENOENT) => true,
            Some(e) => return Err(e),
        };
        let n = (attr.count as usize).min(want);
        for i in 0..n {
            each(
                &keys[i * key_size..(i + 1) * key_size],
                &values[i * value_size..(i + 1) * value_size],
            );
        }
        seen += n;
        if done {
            return Ok(());
        }
        token_in = token_out;
        first = false;
    }
}
