//! The generic registry: what every kind's verbs share.
//!
//! Start with [`Registry`]: it runs get, list, watch, create, update, patch and delete for one
//! kind, calling the kind's [`Strategy`] for defaults, validation, allocation and printing,
//! writing through [`capstan_storage::Storage`] transactions and serving lists and watches
//! from the [`cache::WatchCache`].

pub mod cache;
pub mod current;
pub mod decode;
pub mod detached;
pub mod go_nulls;
mod info;
pub mod managed;
mod members;
pub mod object;
mod store;
pub mod strategy;
pub mod typed;
mod under_write;
pub mod watch;

pub use object::Object;
pub use store::{
    Created, DeleteOptions, DeleteResult, FieldValidation, ListOptions, ListResult,
    MAX_OBJECT_BYTES, Patch, ReadAt, Registry, Subresource, WriteOptions,
};
pub use strategy::{Deleting, DynStrategy, ResourceInfo, Strategy, WriteExtras};
