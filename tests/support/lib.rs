//! test support

pub mod app;
pub mod counting;
pub mod db;
pub mod fixtures;
