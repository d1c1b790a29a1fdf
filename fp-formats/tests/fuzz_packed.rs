//! Fuzzing of the decoders of outside bytes (issue #13): packed FP4 and FP6 buffers of any
//! length against any element count, and every code of every element format. Bounded case
//! counts (see `CASES`) keep the harness at well under a second in CI; the inputs tried are
//! reported in the crate README.

use fp_formats::mx::{decode, MxElement};
use fp_formats::pack::{
    fp4_packed_len, fp6_packed_len, pack_fp4, pack_fp6, unpack_fp4, unpack_fp6,
};
use fp_formats::FormatError;
use proptest::prelude::*;

/// Inputs per harness.
const CASES: u32 = 4096;

const ELEMENTS: [MxElement; 5] = [
    MxElement::E4M3,
    MxElement::E5M2,
    MxElement::E2M3,
    MxElement::E3M2,
    MxElement::E2M1,
];

/// Checks one unpacking of `packed` as `n` codes of `bits` bits: a typed error exactly when
/// the length does not match; otherwise codes in range whose repacking gives back the buffer
/// (up to the unused bits of the last byte) and that decode without panicking.
fn check_unpack(packed: &[u8], n: usize, bits: u32) -> Result<(), TestCaseError> {
    let (r, want_len) = if bits == 4 {
        (unpack_fp4(packed, n), fp4_packed_len(n))
    } else {
        (unpack_fp6(packed, n), fp6_packed_len(n))
    };
    match r {
        Err(FormatError::BadBufferLength { expected, got }) => {
            prop_assert_eq!(expected, want_len);
            prop_assert_eq!(got, packed.len());
            prop_assert_ne!(packed.len(), want_len);
        }
        Err(e) => return Err(TestCaseError::fail(format!("unexpected error {e}"))),
        Ok(codes) => {
            prop_assert_eq!(packed.len(), want_len);
            prop_assert_eq!(codes.len(), n);
            prop_assert!(codes.iter().all(|&c| u32::from(c) >> bits == 0));
            let again = if bits == 4 {
                pack_fp4(&codes)
            } else {
                pack_fp6(&codes)
            };
            prop_assert_eq!(again.len(), packed.len());
            // every bit that holds a code round-trips
            let used = n * bits as usize;
            for bit in 0..used {
                let (byte, shift) = (bit / 8, bit % 8);
                prop_assert_eq!((again[byte] >> shift) & 1, (packed[byte] >> shift) & 1);
            }
            for element in ELEMENTS {
                if element.bits() == bits {
                    for &c in &codes {
                        prop_assert!(decode(element, c).is_finite(), "{element:?} {c:#x}");
                    }
                }
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(CASES))]

    /// Arbitrary buffers against arbitrary element counts (mostly mismatched).
    #[test]
    fn arbitrary_packed_buffers(packed in proptest::collection::vec(any::<u8>(), 0..64),
                                n in 0usize..100) {
        check_unpack(&packed, n, 4)?;
        check_unpack(&packed, n, 6)?;
    }

    /// Buffers of the right length (the decoding path proper), any contents.
    #[test]
    fn matching_packed_buffers(n in 0usize..200, seed in any::<u64>()) {
        let mut s = seed;
        let mut byte = || {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (s >> 56) as u8
        };
        let p4: Vec<u8> = (0..fp4_packed_len(n)).map(|_| byte()).collect();
        let p6: Vec<u8> = (0..fp6_packed_len(n)).map(|_| byte()).collect();
        check_unpack(&p4, n, 4)?;
        check_unpack(&p6, n, 6)?;
    }

    /// Every byte decodes in every element format (codes out of a format's range included:
    /// their unused high bits are ignored), never panicking; FP4 and FP6 are always finite.
    #[test]
    fn any_code_decodes(code in any::<u8>()) {
        for element in ELEMENTS {
            let v = decode(element, code);
            if element.bits() < 8 {
                prop_assert!(v.is_finite());
                prop_assert_eq!(v.to_bits(), decode(element, code & ((1 << element.bits()) - 1)).to_bits());
            }
        }
    }
}
