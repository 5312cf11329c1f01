//! test support

pub mod app;
pub mod db;
pub mod fixtures;
