// A fixture for the layering test: ops/ including core/ points down and is fine.
#pragma once
#include "trainmem/core/tensor.hpp"
