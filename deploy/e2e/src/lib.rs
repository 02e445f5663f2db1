//! End-to-end tests of the Floodgate stack; see `tests/e2e/main.rs`. This crate has no code
//! of its own: the tests start the real gateway, booking and sandbox provider in-process.
