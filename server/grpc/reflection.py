"""gRPC server reflection, `grpc.reflection.v1` and `v1alpha` (grpc/grpc doc/server-reflection.md): what
grpcurl and grpcui use to list the services and call them without .proto files.

The descriptors served are proto/descriptors.binpb, the FileDescriptorSet `make proto` writes beside the
generated modules (a test checks it is current). A file is sent with the files it imports, as grpc-go's
reflection does. Our protos declare no extensions: the extension queries answer an empty list for a
known message and NOT_FOUND otherwise.
"""

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import tensorgate.proto.grpc.reflection.v1 as v1
import tensorgate.proto.grpc.reflection.v1alpha as v1alpha
from tensorgate import proto
from tensorgate.codec.protowire import LEN, fields, text

DESCRIPTORS = Path(proto.__file__).parent / "descriptors.binpb"
NOT_FOUND = 5  # grpc-status code, in ErrorResponse

# Field numbers in descriptor.proto
FILE_NAME, FILE_PACKAGE, FILE_DEPENDENCY, FILE_MESSAGE, FILE_ENUM, FILE_SERVICE = 1, 2, 3, 4, 5, 6
MESSAGE_NAME, MESSAGE_NESTED, MESSAGE_ENUM = 1, 3, 4
SERVICE_NAME, SERVICE_METHOD = 1, 2


class Descriptors:
    """The FileDescriptorProtos of a FileDescriptorSet, by file name and by every symbol they define."""

    def __init__(self, descriptor_set: bytes) -> None:
        self.files: dict[str, bytes] = {}
        self.dependencies: dict[str, list[str]] = {}
        self.symbols: dict[str, str] = {}  # full name (message, enum, service, method) -> file name
        self.messages: set[str] = set()  # full names of the messages among them
        for number, wire, start, stop in fields(descriptor_set, 0, len(descriptor_set)):
            if number == 1 and wire == LEN:
                self._add_file(descriptor_set[start:stop])

    def _add_file(self, data: bytes) -> None:
        name, package, dependencies = "", "", []
        messages: list[str] = []
        others: list[str] = []
        for number, wire, start, stop in fields(data, 0, len(data)):
            if wire != LEN:
                continue
            if number == FILE_NAME:
                name = text(data, start, stop)
            elif number == FILE_PACKAGE:
                package = text(data, start, stop)
            elif number == FILE_DEPENDENCY:
                dependencies.append(text(data, start, stop))
            elif number == FILE_MESSAGE:
                _walk_message(data, start, stop, "", messages, others)
            elif number == FILE_ENUM:
                others.append(_name(data, start, stop))
            elif number == FILE_SERVICE:
                service = _name(data, start, stop)
                others.append(service)
                others += (
                    f"{service}.{_name(data, begin, end)}"
                    for method, kind, begin, end in fields(data, start, stop)
                    if method == SERVICE_METHOD and kind == LEN
                )
        prefix = f"{package}." if package else ""
        self.files[name] = data
        self.dependencies[name] = dependencies
        for symbol in messages + others:
            self.symbols[prefix + symbol] = name
        self.messages.update(prefix + m for m in messages)

    def with_dependencies(self, name: str) -> list[bytes]:
        """The file, then every file it imports (transitively), each once."""
        order, todo = [], [name]
        while todo:
            current = todo.pop()
            if current not in order and current in self.files:
                order.append(current)
                todo += self.dependencies[current]
        return [self.files[n] for n in order]


def _walk_message(
    data: bytes, start: int, stop: int, outer: str, messages: list[str], others: list[str]
) -> None:
    """A DescriptorProto's name, and its nested messages' and enums', qualified by `outer`."""
    name = outer + _name(data, start, stop)
    messages.append(name)
    for number, wire, begin, end in fields(data, start, stop):
        if number == MESSAGE_NESTED and wire == LEN:
            _walk_message(data, begin, end, name + ".", messages, others)
        elif number == MESSAGE_ENUM and wire == LEN:
            others.append(f"{name}.{_name(data, begin, end)}")


def _name(data: bytes, start: int, stop: int) -> str:
    for number, wire, begin, end in fields(data, start, stop):
        if number == 1 and wire == LEN:
            return text(data, begin, end)
    return ""


class Reflection:
    """The answers, the same in both versions of the protocol (`pb`: the version's generated module)."""

    def __init__(self, descriptors: Descriptors) -> None:
        self.descriptors = descriptors
        self.services: list[str] = []  # the gRPC services served (set once every servicer is made)

    def answer(self, request: Any, pb: Any) -> Any:
        response = pb.ServerReflectionResponse(valid_host=request.host, original_request=request)
        found = self.descriptors
        if request.list_services is not None:
            response.list_services_response = pb.ListServiceResponse(
                service=[pb.ServiceResponse(name=name) for name in self.services]
            )
        elif request.file_by_filename is not None:
            if request.file_by_filename in found.files:
                response.file_descriptor_response = pb.FileDescriptorResponse(
                    found.with_dependencies(request.file_by_filename)
                )
            else:
                response.error_response = _not_found(pb, f"file not found: {request.file_by_filename}")
        elif request.file_containing_symbol is not None:
            file = found.symbols.get(request.file_containing_symbol)
            if file is not None:
                response.file_descriptor_response = pb.FileDescriptorResponse(found.with_dependencies(file))
            else:
                symbol = request.file_containing_symbol
                response.error_response = _not_found(pb, f"symbol not found: {symbol}")
        elif request.all_extension_numbers_of_type is not None:
            base = request.all_extension_numbers_of_type
            if base in found.messages:
                response.all_extension_numbers_response = pb.ExtensionNumberResponse(base_type_name=base)
            else:
                response.error_response = _not_found(pb, f"type not found: {base}")
        elif request.file_containing_extension is not None:
            extension = request.file_containing_extension
            response.error_response = _not_found(
                pb, f"extension not found: {extension.containing_type}({extension.extension_number})"
            )
        else:
            response.error_response = pb.ErrorResponse(3, "the request names no query")  # INVALID_ARGUMENT
        return response


def _not_found(pb: Any, message: str) -> Any:
    return pb.ErrorResponse(error_code=NOT_FOUND, error_message=message)


class ReflectionV1(v1.ServerReflectionBase):
    def __init__(self, reflection: Reflection) -> None:
        self.reflection = reflection

    async def server_reflection_info(
        self, messages: AsyncIterator[v1.ServerReflectionRequest]
    ) -> AsyncIterator[v1.ServerReflectionResponse]:
        async for request in messages:
            yield self.reflection.answer(request, v1)


class ReflectionV1Alpha(v1alpha.ServerReflectionBase):
    def __init__(self, reflection: Reflection) -> None:
        self.reflection = reflection

    async def server_reflection_info(
        self, messages: AsyncIterator[v1alpha.ServerReflectionRequest]
    ) -> AsyncIterator[v1alpha.ServerReflectionResponse]:
        async for request in messages:
            yield self.reflection.answer(request, v1alpha)
