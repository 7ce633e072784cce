//! ringleader
