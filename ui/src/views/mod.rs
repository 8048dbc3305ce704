//! One module per view; the app's router picks one by the hash route.

pub mod decisions;
pub mod fleet;
pub mod headroom;
pub mod heat;
pub mod history;
pub mod pd;
pub mod policy;
pub mod push;
pub mod replica;
pub mod settings;
pub mod whatif;
