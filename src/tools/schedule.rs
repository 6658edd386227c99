//! OWNER: turn machine (issue 3): the pure tool-pool rules the tool-pool actor drives.
