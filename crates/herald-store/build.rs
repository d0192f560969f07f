// `sqlx::migrate!` embeds the migration files at compile time; without this a
// new migration file would not rebuild the crate that embeds them.
fn main() {
    println!("cargo:rerun-if-changed=../../migrations");
}
