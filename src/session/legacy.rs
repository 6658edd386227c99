//! Read-time conversions of older DSH log shapes (`reference/session-llm.md` §5.7) and of the
//! original's storage rows (packed chunk rows, §4.2), used when importing logs written by the original.
//!
//! OWNER: session helper (issue 2).
