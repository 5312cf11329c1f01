//! test support

pub mod app;
pub mod binary;
pub mod counting;
pub mod db;
pub mod fixtures;
pub mod procs;
