// A fixture for the layering test: core/ reaching up into ops/ must be reported.
#pragma once
#include "trainmem/ops/matmul.hpp"
