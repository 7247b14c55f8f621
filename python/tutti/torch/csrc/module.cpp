/* tutti.torch._C: the Python face of ProcessGroupTutti, the creator that
 * torch.distributed.Backend.register_backend("tutti", ...) calls. torch must be imported
 * first (its pybind types, c10d.ProcessGroup and Store, are this module's bases). */
#include <pybind11/chrono.h>
#include <pybind11/pybind11.h>
#include <torch/csrc/utils/pybind.h>

#include "process_group.hpp"

namespace py = pybind11;

namespace
{

c10::intrusive_ptr<tutti_torch::ProcessGroupTutti> create(
    const c10::intrusive_ptr<c10d::Store> &store, int rank, int size,
    std::chrono::milliseconds timeout)
{
    py::gil_scoped_release nogil; /* set-up waits for the other ranks */
    return c10::make_intrusive<tutti_torch::ProcessGroupTutti>(store, rank, size, timeout);
}

} // namespace

PYBIND11_MODULE(_C, m)
{
    m.doc() = "tutti's c10d process group (torch.distributed backend \"tutti\")";
    py::class_<tutti_torch::ProcessGroupTutti, tutti_torch::PGBase,
               c10::intrusive_ptr<tutti_torch::ProcessGroupTutti>>(m, "ProcessGroupTutti")
        .def_property_readonly("transport", &tutti_torch::ProcessGroupTutti::transport)
        .def_property_readonly("timeout", &tutti_torch::ProcessGroupTutti::timeout)
        .def("set_timeout", &tutti_torch::ProcessGroupTutti::set_timeout, py::arg("timeout"),
             py::call_guard<py::gil_scoped_release>())
        .def("trace", &tutti_torch::ProcessGroupTutti::trace,
             py::call_guard<py::gil_scoped_release>())
        /* torch >= 2.1 binds these on its Backend too; here for torch 1.x (and tests) */
        .def(
            "allgather_into_tensor_coalesced",
            [](tutti_torch::ProcessGroupTutti &pg, std::vector<at::Tensor> outputs,
               std::vector<at::Tensor> inputs, const c10d::AllgatherOptions &opts) {
                return pg.allgather_into_tensor_coalesced(outputs, inputs, opts);
            },
            py::arg("outputs"), py::arg("inputs"), py::arg("opts") = c10d::AllgatherOptions(),
            py::call_guard<py::gil_scoped_release>())
        .def(
            "reduce_scatter_tensor_coalesced",
            [](tutti_torch::ProcessGroupTutti &pg, std::vector<at::Tensor> outputs,
               std::vector<at::Tensor> inputs, const c10d::ReduceScatterOptions &opts) {
                return pg.reduce_scatter_tensor_coalesced(outputs, inputs, opts);
            },
            py::arg("outputs"), py::arg("inputs"), py::arg("opts") = c10d::ReduceScatterOptions(),
            py::call_guard<py::gil_scoped_release>())
        .def("start_coalescing", &tutti_torch::ProcessGroupTutti::begin_batch,
             py::call_guard<py::gil_scoped_release>())
        .def("end_coalescing", &tutti_torch::ProcessGroupTutti::end_batch,
             py::call_guard<py::gil_scoped_release>());
    m.def("create_process_group", &create, py::arg("store"), py::arg("rank"), py::arg("size"),
          py::arg("timeout"));
    m.attr("TORCH_VERSION_MAJOR") = TORCH_VERSION_MAJOR;
}
