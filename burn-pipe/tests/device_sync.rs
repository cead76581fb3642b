//! A device that fails to synchronise while the units are profiled or
//! their memory measured: an error naming the unit, not a panic (a fault
//! injected at `burn_pipe::fault::DEVICE_SYNC`, as a failing device's sync
//! would fail).
//!
//! One test, alone in its binary: an armed fault fires at the first point
//! that matches, whichever test reaches it.

mod common;

use burn_freeze::fault::{self, Fault};
use burn_pipe::balance::{HeapCounter, measure_unit_memory};
use burn_pipe::fault::DEVICE_SYNC;
use burn_pipe::micro::{MicroSearchError, profile_micro_batches};
use burn_pipe::{PipeError, profile_units};
use common::{user_batch, user_stack};

#[global_allocator]
static HEAP: HeapCounter = HeapCounter;

fn sync_fails_at(unit: usize) {
    fault::arm(Fault {
        phase: DEVICE_SYNC,
        stage: Some(unit),
        micro_batch: None,
        panic: false,
        stall: None,
    });
}

#[test]
fn a_failing_device_sync_is_an_error_naming_the_unit() {
    let device = Default::default();
    let stack = user_stack(4, 8, 2, 2);
    let units = stack.num_units();
    let (x, _) = user_batch(7, 12, 4, 2);

    // Profiling: the unit's timing fails, named.
    sync_fails_at(2);
    let error = profile_units(&stack, x.clone(), &device, 2).unwrap_err();
    assert!(!fault::disarm(), "the fault fired");
    assert!(
        matches!(
            error,
            PipeError::DeviceSync {
                during: "profiling",
                unit: 2,
                ..
            }
        ),
        "{error}"
    );
    let message = error.to_string();
    assert!(
        message.contains("device sync failed while profiling unit 2")
            && message.contains("injected fault in device sync"),
        "{message}"
    );
    // The device works again: every unit is timed.
    assert_eq!(
        profile_units(&stack, x.clone(), &device, 1).unwrap().len(),
        units
    );

    // The micro-batch table: the size whose profile failed, named (the
    // largest is timed first).
    sync_fails_at(0);
    let error = profile_micro_batches(&stack, x.clone(), &device, &[1, 2], 1).unwrap_err();
    assert!(!fault::disarm(), "the fault fired");
    assert!(
        matches!(&error, MicroSearchError::Profile { size: 2, error } if error.contains("unit 0")),
        "{error}"
    );

    // Measuring the memory (the heap counter installed above): the last
    // unit's sync fails, named.
    assert!(HeapCounter::installed());
    sync_fails_at(units - 1);
    let error = measure_unit_memory(&stack, x.clone(), &device).unwrap_err();
    assert!(!fault::disarm(), "the fault fired");
    assert!(
        matches!(error, PipeError::DeviceSync { unit, .. } if unit == units - 1),
        "{error}"
    );
    assert!(
        error
            .to_string()
            .contains("while measuring the memory of unit"),
        "{error}"
    );
    let memory = measure_unit_memory(&stack, x, &device).unwrap();
    assert_eq!(memory.activations.len(), units);
}
