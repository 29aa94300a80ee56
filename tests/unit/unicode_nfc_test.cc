// io::nfc_normalize on the cases UAX #15 singles out: composition, canonical reordering, blocking,
// singletons, composition exclusions, Hangul by arithmetic, and where tokenizers' older tables differ from
// Unicode 14.0. The e2e tokenizer test compares every code point and a random corpus with the tokenizers
// package and with Python's unicodedata.
#include "io/unicode_nfc.h"

#include <gtest/gtest.h>

#include <string>

namespace symprune::io {
namespace {

TEST(UnicodeNfc, AsciiAndComposedTextComeBackAsIs) {
  EXPECT_EQ(nfc_normalize(""), "");
  EXPECT_EQ(nfc_normalize("plain ASCII\n\t~"), "plain ASCII\n\t~");
  EXPECT_EQ(nfc_normalize("caf\u00E9 \u4E2D\u6587 \U0001F600"), "caf\u00E9 \u4E2D\u6587 \U0001F600");
  EXPECT_STREQ(nfc_unicode_version(), "14.0.0");
}

TEST(UnicodeNfc, ComposesAndReorders) {
  EXPECT_EQ(nfc_normalize("e\u0301"), "\u00E9");
  // Ḉ: C + cedilla (class 202) + acute (230), given in either order of the marks.
  EXPECT_EQ(nfc_normalize("C\u0327\u0301"), "\u1E08");
  EXPECT_EQ(nfc_normalize("C\u0301\u0327"), "\u1E08");
  // Two marks of the same class: the second is blocked by the first and stays.
  EXPECT_EQ(nfc_normalize("a\u0301\u0301"), "\u00E1\u0301");
  // A dot below (220) and a circumflex (230) on a: ậ, whatever order they came in.
  EXPECT_EQ(nfc_normalize("a\u0302\u0323"), "\u1EAD");
  EXPECT_EQ(nfc_normalize("\u00E2\u0323"), "\u1EAD");
  // A leading combining mark composes with nothing.
  EXPECT_EQ(nfc_normalize("\u0301e"), "\u0301e");
}

TEST(UnicodeNfc, SingletonsAndExclusionsStayDecomposed) {
  EXPECT_EQ(nfc_normalize("\u212B"), "\u00C5");        // ANGSTROM SIGN -> Å
  EXPECT_EQ(nfc_normalize("\u2126"), "\u03A9");        // OHM SIGN -> Ω
  EXPECT_EQ(nfc_normalize("\uF900"), "\u8C48");        // a CJK compatibility ideograph
  EXPECT_EQ(nfc_normalize("\u0958"), "\u0915\u093C");  // DEVANAGARI QA: a composition exclusion
  EXPECT_EQ(nfc_normalize("\u0344"), "\u0308\u0301");  // a non-starter decomposition
  EXPECT_EQ(nfc_normalize("\uFB01"), "\uFB01");        // fi ligature: compatibility only, NFC keeps it
}

TEST(UnicodeNfc, HangulByArithmetic) {
  EXPECT_EQ(nfc_normalize("\u1100\u1161"), "\uAC00");              // L V -> 가
  EXPECT_EQ(nfc_normalize("\u1100\u1161\u11A8"), "\uAC01");        // L V T -> 각
  EXPECT_EQ(nfc_normalize("\uAC00\u11A8"), "\uAC01");              // LV T -> 각
  EXPECT_EQ(nfc_normalize("\uAC01\u11A8"), "\uAC01\u11A8");        // LVT T: nothing more to compose
  EXPECT_EQ(nfc_normalize("\u1100\u1161\u11A7"), "\uAC00\u11A7");  // U+11A7 is below the first T
  EXPECT_EQ(nfc_normalize("\uD7A3"), "\uD7A3");
}

TEST(UnicodeNfc, SupplementaryPlanes) {
  EXPECT_EQ(nfc_normalize("\U0001D15E"), "\U0001D157\U0001D165");  // MUSICAL SYMBOL HALF NOTE: excluded
  EXPECT_EQ(nfc_normalize("\U00011099\U000110BA"), "\U0001109A");  // KAITHI LETTER DDDHA
  EXPECT_EQ(nfc_normalize("\U0002F800"), "\u4E3D");                // CJK compatibility supplement
}

// Where tokenizers' older tables and Unicode 14.0 disagree, symprune gives tokenizers' result (its ids).
TEST(UnicodeNfc, MarksNewerThanTokenizersTablesAreStarters) {
  // U+0334 (class 1) goes before U+0301 (230), which then composes; not before U+0898 (230 since 14.0).
  EXPECT_EQ(nfc_normalize("a\u0301\u0334"), "\u00E1\u0334");
  EXPECT_EQ(nfc_normalize("a\u0898\u0334"), "a\u0898\u0334");
  EXPECT_EQ(nfc_normalize("\U00011938"), "\U00011938");                      // DIVES AKURU VOWEL SIGN O: kept
  EXPECT_EQ(nfc_normalize("\U00011935\U00011930"), "\U00011935\U00011930");  // and not composed
}

}  // namespace
}  // namespace symprune::io
