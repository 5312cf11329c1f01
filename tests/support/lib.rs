//! test support

pub mod app;
pub mod db;
