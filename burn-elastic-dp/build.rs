//! With the `mpi` feature: compiles `src/nodes/mpi/in_place.c`, which reads
//! `MPI_IN_PLACE` from the system's `mpi.h` (rsmpi 0.8 does not export it).

fn main() {
    #[cfg(feature = "mpi")]
    in_place();
}

#[cfg(feature = "mpi")]
fn in_place() {
    const SOURCE: &str = "src/nodes/mpi/in_place.c";
    println!("cargo:rerun-if-changed={SOURCE}");
    let mut build = cc::Build::new();
    build.file(SOURCE);
    match build_probe_mpi::probe() {
        Ok(library) => {
            build.includes(&library.include_paths);
        }
        Err(errors) => {
            // mpi-sys fails the same way and says more; mpi.h may still be
            // on the compiler's default path.
            println!("cargo:warning=burn-elastic-dp: no MPI library found ({errors:?})");
        }
    }
    build.compile("burn_elastic_dp_mpi_in_place");
}
