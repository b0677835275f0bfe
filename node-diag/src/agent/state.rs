//! State the agent's event loop shares with its HTTP handlers: the metrics registry, the
//! findings store and readiness. Locks are taken through the accessors only, which
//! recover a poisoned lock: a panicked handler must not take `/metrics` down with it,
//! and neither value is left half-updated by any of its methods.

use std::sync::{
    Mutex, MutexGuard,
    atomic::{AtomicBool, Ordering},
};

use super::metrics::Metrics;
use crate::findings::Store;

pub(crate) struct Shared {
    metrics: Mutex<Metrics>,
    store: Mutex<Store>,
    ready: AtomicBool,
}

impl Shared {
    pub(crate) fn new(metrics: Metrics, store: Store) -> Self {
        Self {
            metrics: Mutex::new(metrics),
            store: Mutex::new(store),
            ready: AtomicBool::new(false),
        }
    }

    pub(crate) fn metrics(&self) -> MutexGuard<'_, Metrics> {
        lock(&self.metrics)
    }

    pub(crate) fn store(&self) -> MutexGuard<'_, Store> {
        lock(&self.store)
    }

    pub(crate) fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed)
    }

    pub(crate) fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Relaxed);
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}
