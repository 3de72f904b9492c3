//! The global allocator of the `sluice` binary: mimalloc, called the way its plain `malloc` is
//! fastest.
//!
//! The `mimalloc` crate's allocator passes every request to `mi_malloc_aligned`, whatever the
//! alignment. Its fast path serves a block only when the next free one happens to be aligned,
//! and otherwise takes a generic path; measured under callgrind on `sluice serve` answering
//! `/json`, allocation cost about 79 instructions per call over 22 calls per request, and the
//! generic path alone 4.5 calls per request at 193 instructions each. Every block mimalloc hands
//! out of 16 bytes or more is 16-byte aligned (an invariant its allocator asserts in debug
//! builds), and smaller blocks are 8-byte aligned, which is all a layout of that size can ask
//! for: a Rust layout's size is a multiple of its alignment. So a layout aligned to 16 bytes or
//! less goes to `mi_malloc`, `mi_zalloc` and `mi_realloc`, and only a larger alignment to the
//! aligned calls.
//!
//! This crate is the one place in the workspace with `unsafe` code: every other crate forbids it.

#![warn(missing_docs)]

use std::alloc::{GlobalAlloc, Layout};
use std::ffi::c_void;

use libmimalloc_sys as mi;

/// What mimalloc guarantees of any block without being asked (`MI_MAX_ALIGN_SIZE`).
const PLAIN_ALIGN: usize = 16;

/// mimalloc as a global allocator; see the module documentation.
#[derive(Debug, Clone, Copy, Default)]
pub struct Allocator;

/// Whether mimalloc's unaligned calls already give `layout` its alignment.
#[inline(always)]
fn plain(layout: Layout) -> bool {
    layout.align() <= PLAIN_ALIGN && layout.align() <= layout.size()
}

// SAFETY: every method hands the request to mimalloc, which returns null on failure, memory of
// at least the size asked, aligned as `plain` or the aligned call guarantees, and frees or
// reallocates only what it allocated (the caller's contract).
unsafe impl GlobalAlloc for Allocator {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: plain FFI calls with a size and a power-of-two alignment.
        unsafe {
            if plain(layout) {
                mi::mi_malloc(layout.size()).cast()
            } else {
                mi::mi_malloc_aligned(layout.size(), layout.align()).cast()
            }
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as for `alloc`.
        unsafe {
            if plain(layout) {
                mi::mi_zalloc(layout.size()).cast()
            } else {
                mi::mi_zalloc_aligned(layout.size(), layout.align()).cast()
            }
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        // SAFETY: `ptr` came from this allocator (the caller's contract).
        unsafe { mi::mi_free(ptr.cast::<c_void>()) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `ptr` came from this allocator with `layout` (the caller's contract). The new
        // block must keep `layout`'s alignment: a plain block of `new_size` bytes does when
        // `plain` holds for that size, and the aligned call serves the rest (a new size below
        // the alignment, or an alignment over 16).
        unsafe {
            let new = Layout::from_size_align_unchecked(new_size, layout.align());
            if plain(new) {
                mi::mi_realloc(ptr.cast::<c_void>(), new_size).cast()
            } else {
                mi::mi_realloc_aligned(ptr.cast::<c_void>(), new_size, layout.align()).cast()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Allocates, writes, grows, shrinks and frees blocks of every size up to 4 KiB at every
    /// alignment up to 4 KiB, checking each pointer's alignment and that the contents survive
    /// a reallocation.
    #[test]
    fn every_layout_comes_back_aligned_and_keeps_its_contents() {
        let a = Allocator;
        for align in (0..=12).map(|s| 1usize << s) {
            for size in (1..=4096).filter(|s| s % align == 0).step_by(7) {
                let layout = Layout::from_size_align(size, align).unwrap();
                unsafe {
                    let p = a.alloc(layout);
                    assert!(!p.is_null());
                    assert_eq!(p as usize % align, 0, "alloc {size} aligned {align}");
                    std::ptr::write_bytes(p, 0xA5, size);
                    let grown = size * 3;
                    let q = a.realloc(p, layout, grown);
                    assert_eq!(
                        q as usize % align,
                        0,
                        "realloc {size}→{grown} aligned {align}"
                    );
                    assert!((0..size).all(|i| *q.add(i) == 0xA5));
                    let shrunk = align;
                    let r = a.realloc(q, Layout::from_size_align(grown, align).unwrap(), shrunk);
                    assert_eq!(r as usize % align, 0, "shrink to {shrunk} aligned {align}");
                    assert!((0..shrunk).all(|i| *r.add(i) == 0xA5));
                    a.dealloc(r, Layout::from_size_align(shrunk, align).unwrap());

                    let z = a.alloc_zeroed(layout);
                    assert_eq!(z as usize % align, 0, "zalloc {size} aligned {align}");
                    assert!((0..size).all(|i| *z.add(i) == 0));
                    a.dealloc(z, layout);
                }
            }
        }
    }
}
