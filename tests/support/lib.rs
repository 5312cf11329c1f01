//! test support

pub mod app;
pub mod binary;
pub mod db;
pub mod fixtures;
