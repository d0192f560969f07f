//! The proof beside the product: what shows that Herald keeps its promises,
//! kept apart from the commands and roles that make them.
//!
//! - [`demo`]: `herald demo`, the thin path end to end on the embedded
//!   default, with a worker crash, a lost provider answer and a rebuild,
//!   checked and audited.
//! - [`drill`]: `herald drill`, every role a separate process under
//!   SIGKILLs and broker kills, drained and audited.
//! - [`bench`]: `herald bench relay|consume|rebuild`; its raw-insert
//!   baselines are the only SQL here, the ceiling the product is measured
//!   against.
//! - [`sim`]: the reference notification receiver (`herald provider-sim`),
//!   and [`embedded`], the same receiver in-process for `herald serve` and
//!   the demo on the embedded default.
//!
//! What the demo and the drill count in Herald's tables they read through
//! `herald_status::counts`, the one read path of figures. The `herald`
//! binary parses the commands and calls in here; no product crate depends
//! on this one. Proof tooling run from the binary, it reports errors as
//! `anyhow` like the binary does.

pub mod bench;
pub mod demo;
pub mod drill;
pub mod embedded;
pub mod scratch;
pub mod sim;
