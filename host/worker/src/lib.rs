//! Steps of runs spread over `trellis worker` processes through NATS JetStream.
//!
//! A dispatcher ([`NatsDispatch`], given to a run as its step dispatch) publishes each agent
//! step as a task on the work-queue stream of a pool, with what the step may read as an
//! object; a [`Worker`] of the pool claims it in the key-value bucket of step states, runs
//! it in a scratch workspace through the same runtime as a local run, stores what it wrote
//! and commits once (compare-and-set); the dispatcher brings the step's writable folders
//! back and the run goes on. See `docs/workers.md`.

pub mod artifacts;
pub mod bundle;
pub mod bus;
mod dispatch;
mod worker;

pub use artifacts::{ArtifactStore, FolderArtifacts, ObjectStoreArtifacts};
pub use bus::{Bus, NatsOptions};
pub use dispatch::{NatsDispatch, check_pool};
pub use worker::{StepRunner, Worker, default_name};
