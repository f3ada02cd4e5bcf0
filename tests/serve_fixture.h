// An in-process `kvevict serve` for tests: model, scheduler and API server on an ephemeral
// 127.0.0.1 port, stopped (in the CLI's order) when it goes out of scope.
#pragma once

#include <httplib.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "model/model.h"
#include "serve/http_server.h"
#include "serve/load_client.h"
#include "serve/scheduler.h"
#include "test_paths.h"

namespace kvevict {

// An in-process server on an ephemeral loopback port.
class TestServer {
 public:
  TestServer(const std::string& model_path, serve::SchedulerOptions so, serve::ApiOptions ao) {
    model_ = Model::load(model_path);
    if (ao.model_name.empty()) ao.model_name = "test-model";
    if (ao.max_tokens_limit == 0) ao.max_tokens_limit = model_->config().context_length;
    if (ao.chat_unavailable.empty()) ao.chat_unavailable = "chat templates are not available in this build";
    sched_ = std::make_unique<serve::Scheduler>(*model_, so);
    api_ = std::make_unique<serve::ApiServer>(*sched_, ao);
    port_ = api_->bind("127.0.0.1", 0);
    thread_ = std::thread([this] { api_->run(); });
    httplib::Client c("127.0.0.1", port_);
    for (int i = 0; i < 500; ++i) {
      if (auto r = c.Get("/health"); r && r->status == 200) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ADD_FAILURE() << "server did not come up";
  }
  ~TestServer() {
    api_->begin_shutdown();
    sched_->shutdown(std::chrono::milliseconds(0));
    api_->stop();
    thread_.join();
  }
  int port() const { return port_; }
  const Model& model() const { return *model_; }
  serve::Scheduler& sched() { return *sched_; }
  std::unique_ptr<httplib::Client> client() const {
    auto c = std::make_unique<httplib::Client>("127.0.0.1", port_);
    c->set_read_timeout(120, 0);
    return c;
  }
  double metric(const std::string& name) const {
    auto r = client()->Get("/metrics");
    return r ? serve::metric_value(r->body, name) : -1;
  }

 private:
  std::unique_ptr<Model> model_;
  std::unique_ptr<serve::Scheduler> sched_;
  std::unique_ptr<serve::ApiServer> api_;
  std::thread thread_;
  int port_ = 0;
};

inline serve::SchedulerOptions small_opts(int64_t pool = 64 << 20, int max_seqs = 64, int max_queue = 256) {
  serve::SchedulerOptions so;
  so.threads = 1;
  so.kv_memory_bytes = pool;
  so.max_seqs = max_seqs;
  so.max_queue = max_queue;
  return so;
}

}  // namespace kvevict
