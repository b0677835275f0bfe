#![no_std]
// Library target so the workspace can type-check this crate on the host.
