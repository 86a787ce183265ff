//! The store data of one call: the slices' per-call states, the resource table they
//! share, and the memory limiter.

use wasmtime::ResourceLimiter;
use wasmtime::component::ResourceTable;

use super::slices::commands::CommandsState;
use super::slices::db::DbState;
use super::slices::fs::FsState;
use super::slices::http::HttpState;
use super::slices::log::LogState;
use super::slices::reply::ReplyState;

/// Store data of one call. A fresh one is made for every call, each slice's state built
/// from the call's grant; a world that does not link a slice never reaches its state.
pub(crate) struct CallState {
    pub(crate) table: ResourceTable,
    pub(crate) memory: MemoryLimit,
    pub(crate) fs: FsState,
    pub(crate) db: DbState,
    pub(crate) http: HttpState,
    pub(crate) log: LogState,
    pub(crate) reply: ReplyState,
    pub(crate) commands: CommandsState,
}

/// Memory budget of one instance: all its linear memories and tables together (a
/// table element counts as a pointer). Exceeding it traps the call with
/// [`MemoryLimitExceeded`], which the host reports as such rather than as a crash.
pub(crate) struct MemoryLimit {
    limit: usize,
    /// Bytes granted so far to the store's memories and tables.
    used: usize,
    pub(crate) exceeded: Option<usize>,
}

impl MemoryLimit {
    pub(crate) fn new(limit: usize) -> Self {
        MemoryLimit {
            limit,
            used: 0,
            exceeded: None,
        }
    }

    /// Grants growing one memory or table from `current` to `desired` bytes if the
    /// instance's total stays within the limit.
    fn grow(&mut self, current: usize, desired: usize) -> wasmtime::Result<bool> {
        let total = self.used.saturating_add(desired.saturating_sub(current));
        if total > self.limit {
            self.exceeded = Some(total);
            return Err(MemoryLimitExceeded {
                limit: self.limit,
                desired: total,
            }
            .into());
        }
        self.used = total;
        Ok(true)
    }
}

/// The trap raised when a guest asks for more memory than its limit.
#[derive(Debug, thiserror::Error)]
#[error(
    "memory limit of {limit} bytes exceeded (its memories and tables together asked for {desired} bytes)"
)]
pub(crate) struct MemoryLimitExceeded {
    pub(crate) limit: usize,
    pub(crate) desired: usize,
}

/// Elements one table may hold, whatever the memory budget.
const MAX_TABLE_ELEMENTS: usize = 100_000;

impl ResourceLimiter for MemoryLimit {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        self.grow(current, desired)
    }

    fn table_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > MAX_TABLE_ELEMENTS {
            return Ok(false);
        }
        let pointer = std::mem::size_of::<usize>();
        self.grow(current * pointer, desired * pointer)
    }
}

pub(crate) use crate::cut::truncate;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_covers_every_memory_and_table_of_an_instance() {
        let mut limit = MemoryLimit::new(100 << 20);
        // Eleven memories of 9 MiB each fit; a twelfth does not.
        for _ in 0..11 {
            assert!(limit.memory_growing(0, 9 << 20, None).unwrap());
        }
        let err = limit.memory_growing(0, 9 << 20, None).unwrap_err();
        assert_eq!(
            err.to_string(),
            "memory limit of 104857600 bytes exceeded (its memories and tables together asked for 113246208 bytes)"
        );
        assert_eq!(limit.exceeded, Some(108 << 20));
        // Growing counts only the difference, and tables count too.
        let mut limit = MemoryLimit::new(10 << 20);
        assert!(limit.memory_growing(0, 4 << 20, None).unwrap());
        assert!(limit.memory_growing(4 << 20, 8 << 20, None).unwrap());
        assert!(limit.table_growing(0, 1000, None).unwrap());
        assert!(limit.table_growing(1000, 300_000, None).is_ok_and(|ok| !ok));
        assert!(limit.memory_growing(0, 2 << 20, None).is_err());
    }
}
