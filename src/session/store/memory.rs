//! OWNER: store helper (issue 2, item 7).
