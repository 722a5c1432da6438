// trainmem/autograd/parameter_list.hpp — what a list of parameters handed to an
// optimizer, MasterWeights or DataParallel must be.
//
// Each element is a parameter (a defined leaf that requires grad, so it has a .grad to
// update from), and no two share values: a tied parameter listed twice would be updated
// twice a step, its gradient averaged twice, its master made twice. Views of one
// storage that do not overlap (ZeRO's shards of one flat buffer) are distinct
// parameters. Checking the whole list before changing anything keeps construction all
// or nothing.
#pragma once

#include <cstddef>
#include <string_view>
#include <vector>

#include "trainmem/autograd/var.hpp"
#include "trainmem/error.hpp"

namespace trainmem {

/// Throws trainmem::Error, naming `who` and the offending entries, unless every element
/// of `params` is a parameter and no two share values.
template <class B>
void check_parameter_list(const std::vector<Var<B>>& params, std::string_view who) {
  for (std::size_t i = 0; i < params.size(); ++i) {
    const Var<B>& p = params[i];
    detail::check(p.defined(), who, ": parameter ", i, " is an undefined Var");
    detail::check(p.requires_grad() && p.is_leaf(), who, ": '", p.name(), "' (parameter ", i,
                  ") is not a parameter (a leaf that requires grad)");
    for (std::size_t j = 0; j < i; ++j)
      detail::check(!params[j].value().overlaps(p.value()), who, ": parameters ", j, " ('", params[j].name(), "') and ",
                    i, " ('", p.name(), "') share values; list a tied parameter once");
  }
}

}  // namespace trainmem
