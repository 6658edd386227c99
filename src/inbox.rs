//! OWNER: pure-core helper (issue 2, item 4): the two pending queues with normalized splices.
