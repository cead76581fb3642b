//! The backend the examples run on, chosen by cargo feature.

use burn::backend::Autodiff;
use burn::tensor::Device;

#[cfg(feature = "cuda")]
mod chosen {
    /// NVIDIA GPUs through CubeCL.
    pub type Inner = burn::backend::Cuda;
    /// Name printed in reports.
    pub const NAME: &str = "cuda";

    /// GPU `index`, or, when `PIPETRANSFORMER_CUDA_GPUS` is set to a
    /// count N >= 1, GPU `index % N`: several logical devices on fewer
    /// GPUs (`.ci/gpu` sets it to the machine's count). A value that is
    /// not a count >= 1 is ignored with a warning.
    pub fn device(index: usize) -> burn::backend::cuda::CudaDevice {
        // Read once: devices are made in many places.
        static GPUS: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
        let gpus = GPUS.get_or_init(|| {
            let value = std::env::var("PIPETRANSFORMER_CUDA_GPUS").ok()?;
            let count = value.trim().parse::<usize>().ok().filter(|&n| n >= 1);
            if count.is_none() {
                tracing::warn!(%value, "PIPETRANSFORMER_CUDA_GPUS is not a count >= 1; ignored");
            }
            count
        });
        burn::backend::cuda::CudaDevice::new(gpus.map_or(index, |n| index % n))
    }
}

#[cfg(all(feature = "tch", not(feature = "cuda")))]
mod chosen {
    use burn::backend::libtorch::LibTorchDevice;

    /// LibTorch 2.9.
    pub type Inner = burn::backend::LibTorch;
    /// Name printed in reports.
    pub const NAME: &str = "tch";

    /// CUDA device `index`, or the CPU when `PIPETRANSFORMER_TCH_CPU` is set.
    pub fn device(index: usize) -> LibTorchDevice {
        if std::env::var_os("PIPETRANSFORMER_TCH_CPU").is_some() {
            LibTorchDevice::Cpu
        } else {
            LibTorchDevice::Cuda(index)
        }
    }
}

#[cfg(all(feature = "flex", not(any(feature = "cuda", feature = "tch"))))]
mod chosen {
    /// Pure-Rust CPU backend.
    pub type Inner = burn::backend::Flex;
    /// Name printed in reports.
    pub const NAME: &str = "flex (CPU)";

    /// The CPU has one device; every index maps to it.
    pub fn device(_index: usize) -> burn::backend::flex::FlexDevice {
        Default::default()
    }
}

#[cfg(not(any(feature = "flex", feature = "cuda", feature = "tch")))]
compile_error!("enable one backend feature of `examples`: flex (default), cuda or tch");

/// The backend that runs frozen units and evaluation.
///
/// `cuda` wins over `tch`, which wins over `flex` (the default), so
/// `--features cuda` works without `--no-default-features`.
pub type Inner = chosen::Inner;
/// The autodiff backend that trains.
pub type Train = Autodiff<Inner>;
/// Name of the chosen backend.
pub const NAME: &str = chosen::NAME;

/// The first device this process uses: ranks of an MPI job that share a
/// machine take disjoint devices (see [`set_first_device`]).
static FIRST_DEVICE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Makes device `index` of this process the machine's device
/// `first + index`: rank `l` of the job's ranks on one machine, each on `d`
/// devices, sets `l * d`, so that the ranks take disjoint GPUs. On a CPU
/// every index is the one device.
pub fn set_first_device(first: usize) {
    FIRST_DEVICE.store(first, std::sync::atomic::Ordering::SeqCst);
}

/// Device number `index` of this process (the machine's `first + index`,
/// see [`set_first_device`]) on the chosen backend.
pub fn device(index: usize) -> Device<Inner> {
    chosen::device(FIRST_DEVICE.load(std::sync::atomic::Ordering::SeqCst) + index)
}
