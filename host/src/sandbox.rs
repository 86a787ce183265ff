//! The sandbox: runs one call into a WebAssembly component under a grant and limits.
//!
//! It knows nothing of workflows: it takes an `InstancePre`, a [`Grant`](crate::Grant)
//! (folders, database), an HTTP policy and [`Limits`](crate::Limits), and returns a value or
//! one [`CallFailure`](call::CallFailure). Tools, validators, LLM providers and step scripts
//! all run through [`call::run`].
//!
//! - [`call`]: the one call path (store builder, deadline, failure sorting).
//! - [`output`]: the head-and-tail stdout/stderr sink.
//! - [`state`]: the store data of one call and its memory limiter.
//! - [`slices`]: the capabilities fs, db, http and log, each linked once; a world's linker
//!   is the list of its slices.

pub(crate) mod call;
pub(crate) mod output;
pub(crate) mod slices;
pub(crate) mod state;

pub(crate) use call::{Call, CallFailure, CallFuture, run};
