// A communicator for metric tests without MPI: all_reduce adds `others` (the other ranks' sums,
// as their global_sums would hand them over) to the buffer, so one process plays every rank.
// Every other collective throws.
#pragma once

#include <ATen/ATen.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "comm/communicator.h"

namespace fsdp::testing {

struct DoneWork : comm::Work {
  void wait() override {}
  bool is_completed() override { return true; }
};

struct AddingComm : comm::Communicator {
  std::vector<double> others;
  int rank() const override { return 0; }
  int size() const override { return 2; }
  std::string backend() const override { return "test"; }
  c10::DeviceType device_type() const override { return c10::kCPU; }
  std::string group_name() const override { return "world"; }
  comm::WorkPtr all_gather(const at::Tensor&, const at::Tensor&,
                           const comm::CollectiveOptions&) override {
    throw std::runtime_error("unused");
  }
  comm::WorkPtr reduce_scatter(const at::Tensor&, const at::Tensor&, comm::ReduceOp,
                               const comm::CollectiveOptions&) override {
    throw std::runtime_error("unused");
  }
  comm::WorkPtr all_reduce(const at::Tensor& t, comm::ReduceOp,
                           const comm::CollectiveOptions&) override {
    if (!others.empty()) t.add_(at::tensor(others, t.options()));
    return std::make_shared<DoneWork>();
  }
  comm::WorkPtr broadcast(const at::Tensor&, int, const comm::CollectiveOptions&) override {
    throw std::runtime_error("unused");
  }
  comm::WorkPtr all_to_all(const at::Tensor&, const at::Tensor&,
                           const comm::CollectiveOptions&) override {
    throw std::runtime_error("unused");
  }
  void barrier(const comm::CollectiveOptions&) override {}
  void synchronize() override {}
};

}  // namespace fsdp::testing
