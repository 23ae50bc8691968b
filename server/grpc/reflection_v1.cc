#include "server/grpc/reflection_v1.h"

#include <algorithm>
#include <mutex>

#include "google/protobuf/descriptor.h"
#include "google/protobuf/descriptor.pb.h"

namespace kvserve {
namespace {

namespace pb = google::protobuf;
namespace v1 = grpc::reflection::v1;

const pb::FileDescriptor* FileOfSymbol(const pb::DescriptorPool* pool, const std::string& name) {
  if (const auto* d = pool->FindServiceByName(name)) return d->file();
  if (const auto* d = pool->FindMethodByName(name)) return d->service()->file();
  if (const auto* d = pool->FindMessageTypeByName(name)) return d->file();
  if (const auto* d = pool->FindEnumTypeByName(name)) return d->file();
  if (const auto* d = pool->FindEnumValueByName(name)) return d->type()->file();
  if (const auto* d = pool->FindFieldByName(name)) return d->file();
  if (const auto* d = pool->FindExtensionByName(name)) return d->file();
  return nullptr;
}

// The file, then its dependencies, each once per stream.
void AddFile(const pb::FileDescriptor* file, std::vector<std::string>* sent,
             v1::FileDescriptorResponse* out) {
  if (std::find(sent->begin(), sent->end(), file->name()) != sent->end()) return;
  sent->push_back(file->name());
  pb::FileDescriptorProto proto;
  file->CopyTo(&proto);
  out->add_file_descriptor_proto(proto.SerializeAsString());
  for (int i = 0; i < file->dependency_count(); ++i) AddFile(file->dependency(i), sent, out);
}

void SetError(v1::ServerReflectionResponse* r, grpc::StatusCode code, const std::string& msg) {
  r->mutable_error_response()->set_error_code(static_cast<int32_t>(code));
  r->mutable_error_response()->set_error_message(msg);
}

class Reactor
    : public grpc::ServerBidiReactor<v1::ServerReflectionRequest, v1::ServerReflectionResponse> {
 public:
  explicit Reactor(const ReflectionV1Service* service) : service_(service) { StartRead(&request_); }

  void OnReadDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status::OK);
      return;
    }
    response_ = service_->Answer(request_, &sent_);
    StartWrite(&response_);
  }
  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::UNKNOWN, "write failed"));
      return;
    }
    StartRead(&request_);
  }
  void OnDone() override { delete this; }

 private:
  const ReflectionV1Service* service_;
  v1::ServerReflectionRequest request_;
  v1::ServerReflectionResponse response_;
  std::vector<std::string> sent_;
};

}  // namespace

grpc::ServerBidiReactor<v1::ServerReflectionRequest, v1::ServerReflectionResponse>*
ReflectionV1Service::ServerReflectionInfo(grpc::CallbackServerContext*) {
  return new Reactor(this);
}

v1::ServerReflectionResponse ReflectionV1Service::Answer(const v1::ServerReflectionRequest& req,
                                                         std::vector<std::string>* sent) const {
  const pb::DescriptorPool* pool = pb::DescriptorPool::generated_pool();
  v1::ServerReflectionResponse r;
  r.set_valid_host(req.host());
  *r.mutable_original_request() = req;
  switch (req.message_request_case()) {
    case v1::ServerReflectionRequest::kListServices:
      for (const std::string& name : service_names_) {
        r.mutable_list_services_response()->add_service()->set_name(name);
      }
      break;
    case v1::ServerReflectionRequest::kFileByFilename:
      if (const pb::FileDescriptor* f = pool->FindFileByName(req.file_by_filename())) {
        AddFile(f, sent, r.mutable_file_descriptor_response());
      } else {
        SetError(&r, grpc::StatusCode::NOT_FOUND, "file not found: " + req.file_by_filename());
      }
      break;
    case v1::ServerReflectionRequest::kFileContainingSymbol:
      if (const pb::FileDescriptor* f = FileOfSymbol(pool, req.file_containing_symbol())) {
        AddFile(f, sent, r.mutable_file_descriptor_response());
      } else {
        SetError(&r, grpc::StatusCode::NOT_FOUND,
                 "symbol not found: " + req.file_containing_symbol());
      }
      break;
    case v1::ServerReflectionRequest::kFileContainingExtension: {
      const auto& ext = req.file_containing_extension();
      const pb::Descriptor* type = pool->FindMessageTypeByName(ext.containing_type());
      const pb::FieldDescriptor* field =
          type == nullptr ? nullptr : pool->FindExtensionByNumber(type, ext.extension_number());
      if (field != nullptr) {
        AddFile(field->file(), sent, r.mutable_file_descriptor_response());
      } else {
        SetError(&r, grpc::StatusCode::NOT_FOUND, "extension not found");
      }
      break;
    }
    case v1::ServerReflectionRequest::kAllExtensionNumbersOfType: {
      const pb::Descriptor* type = pool->FindMessageTypeByName(req.all_extension_numbers_of_type());
      if (type == nullptr) {
        SetError(&r, grpc::StatusCode::NOT_FOUND,
                 "type not found: " + req.all_extension_numbers_of_type());
        break;
      }
      std::vector<const pb::FieldDescriptor*> exts;
      pool->FindAllExtensions(type, &exts);
      auto* out = r.mutable_all_extension_numbers_response();
      out->set_base_type_name(type->full_name());
      for (const pb::FieldDescriptor* f : exts) out->add_extension_number(f->number());
      break;
    }
    case v1::ServerReflectionRequest::MESSAGE_REQUEST_NOT_SET:
      SetError(&r, grpc::StatusCode::INVALID_ARGUMENT, "no request in the message");
      break;
  }
  return r;
}

}  // namespace kvserve
