//! The process's heap after a large piece of work: what it freed goes back to the system.

/// Gives the allocator's free memory back to the system. The allocator keeps the pages of
/// each thread's arena once freed, so a server whose threads each did one large piece of
/// work (a large query, a large file parsed) would hold the sum of them once idle.
pub fn give_back() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free memory of the allocator's own arenas.
    unsafe {
        libc::malloc_trim(0);
    }
}
