#include "digit_sum.h"

namespace digit_sum {

}  // namespace digit_sum
